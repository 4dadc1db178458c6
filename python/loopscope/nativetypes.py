"""What some of the native binding's functions return, importable at run time.

The stub (``_native.pyi``) declares the binding's types for the type
checker; these are also what commands print with ``--json`` (the clock-sync
responder and initiator, the receiver's flows), so they live here, where the
docs check of every ``--json`` (tests/test_json_docs.py) can read their
keys, and the stub imports them.
"""

from __future__ import annotations

from typing_extensions import TypedDict


class SyncServeCounts(TypedDict):
    """The clock-sync responder's counts."""

    received: int
    answered: int
    malformed: int
    send_errors: int
    no_tx_stamp: int
    no_rx_stamp: int
    elapsed_ns: int
    interrupted: bool


class SyncProbeCounts(TypedDict):
    """The clock-sync initiator's counts."""

    pairs: int
    sent: int
    answered: int
    lost: int
    send_errors: int
    no_tx_stamp: int
    malformed: int
    min_rtt_ns: int | None
    elapsed_ns: int
    interrupted: bool


class RecvFlow(TypedDict):
    """One flow's sequence accounting at the receiver."""

    flow: int
    first_seq: int
    max_seq: int
    received: int
    unique: int
    duplicates: int
    reordered: int
    beyond_window: int
    lost: int
