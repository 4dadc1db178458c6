//! Channels of time-sequenced items across threads, processes and hosts
//! (the Stampede model of Paul et al. 2003), instrumented at their layer
//! boundaries.
//!
//! - [`chan`]: one channel: put, get (next, latest, by timestamp),
//!   consume, several consumers, bounded with a policy when full;
//! - [`hub`]: the channels a process hosts and the network that reaches
//!   them (TCP, or UDP with fragmentation), remote producers and consumers;
//! - [`wire`]: the frame format; [`inst`]: the trace records;
//! - [`raw`]: the raw socket ping-pong the channels are measured against.

pub mod chan;
pub mod error;
pub mod hub;
pub mod inst;
pub mod pool;
pub mod raw;
pub mod wire;

pub use chan::{ChanError, Channel, Full, Item, Stats, Which};
pub use error::NetError;
pub use hub::{Hub, NetStats, RemoteConsumer, RemoteProducer, Transport};
