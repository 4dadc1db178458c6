//! Network timing probes: paced sender, kernel-timestamping receiver, echo
//! server and stimulus-response client, bulk load.
//!
//! All share one datagram format ([`packet`]), one way of scheduling
//! departures ([`schedule`]) and one socket layer with kernel timestamps
//! ([`sock`]).

pub mod bulk;
pub mod packet;
pub mod pipe;
pub mod recv;
pub mod rr;
pub mod rr_tcp;
pub mod schedule;
pub mod send;
pub mod sock;
pub mod sync;
