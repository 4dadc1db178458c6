"""What an experiment sets for the whole run beside its probes: clock sync
(and a host's virtual clock), the link emulator, the monitor, the kernel
capture.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from loopscope.units import duration_text, parse_bytes, parse_duration_ns

from loopscope.spec.values import Duration, Model, Name, OptDuration, duration_value


def _signed_duration(v: object) -> int:
    if v in (0, "0"):
        return 0
    if isinstance(v, str) and v.strip().startswith("-"):
        return -duration_value(v.strip()[1:])
    if isinstance(v, str) and v.strip().startswith("+"):
        return duration_value(v.strip()[1:])
    return duration_value(v)


SignedDuration = Annotated[
    int,
    BeforeValidator(_signed_duration),
    PlainSerializer(lambda ns: ("-" if ns < 0 else "") + duration_text(abs(ns)) if ns else "0", return_type=str),
    WithJsonSchema({"type": ["string", "integer"], "description": "a duration with an optional sign, like -1.5s or 200ms, or 0"}),
]


class VirtualClock(Model):
    """Test only: skew every timestamp the host's agent and its children produce (their CLOCK_MONOTONIC
    and CLOCK_REALTIME reads and the kernel packet stamps they read) by offset + drift·(t − run start),
    so clock synchronization has a known error to find between hosts that share one kernel."""

    offset: SignedDuration = Field(0, description="added to every timestamp, e.g. 3ms or -250us")
    drift_ppm: Annotated[float, Field(ge=-1000, le=1000)] = Field(0.0, description="rate error in parts per million, e.g. 20")


#: auto, on or off; YAML's bare on and off (booleans to YAML 1.1) read as the words
OnOff = Annotated[Literal["auto", "on", "off"], BeforeValidator(lambda v: {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v)]


class ClockSync(Model):
    """Clock-sync probes during every multi-host run: coded probe pairs between each host and the reference,
    kernel-timestamped both ways; the offline estimate puts every host on the reference's clock."""

    enabled: OnOff = Field("auto", description="auto: on when the experiment has more than one host")
    reference: Name | None = Field(None, description="the host whose CLOCK_MONOTONIC is the global clock (default: the first host)")
    rate: Annotated[float, Field(gt=0, le=1000)] = Field(20.0, description="probe pairs per second per host")
    gap: Duration = Field(20_000, description="gap between the two probes of a pair")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(9319, description="UDP port of the reference's responder")
    network: Literal["sync", "experiment"] = Field(
        "sync",
        description="sync: the probes use a network of their own (netns hosts: a veth from each host straight to the reference, never emulated; ssh hosts: the reference's sync_address); experiment: they cross the experiment's network and its links",
    )


class EmulatorSettings(Model):
    """How the link emulator (netns hosts, links that ask for delay, jitter, rate, reorder, loss or
    duplication) waits for its next departure."""

    cpu: Annotated[int, Field(ge=0, le=4095)] | None = Field(
        None, description="pin the emulator's forwarding thread to this CPU (pick one the probes and loads do not use)"
    )
    poll: bool = Field(
        False, description="busy-poll instead of sleeping between departures: the most punctual departures, for the price of the whole CPU (use with cpu)"
    )
    rings: bool = Field(True, description="move frames through PACKET_MMAP rings (false: one system call per frame, for comparison)")
    spin: OptDuration = Field(
        150_000, description="the most it spins before a departure instead of sleeping (below this it follows its recent wake-up lateness); 0 never spins"
    )
    spin_quantile: Annotated[float, Field(ge=0.01, le=0.999)] = Field(
        0.5,
        description="which quantile of its wake-up lateness it spins ahead of: 0.5 makes the typical departure punctual for little CPU; 0.99 also cuts the tail, for about twice the CPU the probes share",
    )


_QUANTILE = re.compile(r"^\s*p(\d{1,2}(?:\.\d+)?)\s*$")


def _threshold(v: object) -> str:
    """A time ('200us') or a quantile of the last hour ('p99.9'), as written."""
    if isinstance(v, str):
        m = _QUANTILE.match(v)
        if m and 0 < float(m.group(1)) < 100:
            return v.strip()
        try:
            if parse_duration_ns(v) > 0:
                return v.strip()
        except ValueError:
            pass
    raise PydanticCustomError("duration", "must be a time like 200us or 1ms, or a quantile of the last hour like p99.9 [got {got}]", {"got": v})


def _retain_size(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise PydanticCustomError("duration", "must be a size like 2GB or 500MB [got {got}]", {"got": v})
    try:
        return parse_bytes(v)
    except ValueError:
        raise PydanticCustomError("duration", "must be a size like 2GB or 500MB [got {got}]", {"got": v}) from None


Size = Annotated[int, BeforeValidator(_retain_size), WithJsonSchema({"type": ["string", "integer"], "examples": ["2GB", "500MB"]})]

#: the smallest ``monitor.retain``: a few kept windows (one is ~10-100 kB)
MIN_RETAIN = 1_000_000


class MonitorSettings(Model):
    """What ``loopscope monitor`` keeps (docs/monitor.md): a histogram of every probe per period, and the
    kernel's events around every outlier above the threshold, within a disk budget."""

    period: Duration = Field(60_000_000_000, description="length of one histogram period (at least 1s)")
    threshold: Annotated[str, BeforeValidator(_threshold)] = Field(
        "p99.9", description="an outlier: above this time (200us), or above this quantile of the last hour (p99.9)"
    )
    retain: Size = Field(1_000_000_000, description="disk for kept windows (2GB); the oldest windows go first, their causes stay")
    keep_per_minute: Annotated[int, Field(ge=1, le=6000)] = Field(
        300, description="at most this many windows kept per minute; the rest are counted as not kept (rate)"
    )
    reach: Duration = Field(8_000_000_000, description="how far back the kernel's buffers must reach (their size follows from it)")
    # YAML reads a bare off as false: take it as the word it was
    recorder: Annotated[Literal["alternate", "pause", "drain", "off"], BeforeValidator(lambda v: "off" if v is False else v)] = Field(
        "drain",
        description="drain: one trace instance with small buffers, read every 0.2 s into the recorder's memory (reach's worth), a keep decodes only the window's pages; alternate: two instances, one recording while the other is read; pause: one, paused while it is read (blind meanwhile); off: outliers counted, not kept",
    )

    metrics: Literal["controller", "agent"] = Field(
        "controller",
        description="controller: --metrics serves every host's figures, labelled by host; agent: each host's own are served too, at its address on --metrics's port (for a Prometheus that scrapes each machine)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> "MonitorSettings":
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.period < 1_000_000_000:
            problems.append((("period",), f"must be at least 1s [got {duration_text(self.period)}]"))
        if self.retain < MIN_RETAIN:
            problems.append((("retain",), f"must hold at least one kept window: at least 1MB [got {self.retain} bytes]"))
        if self.reach < 2_000_000_000:
            problems.append((("reach",), f"must be at least 2s: an outlier is seen up to a second after it happened [got {duration_text(self.reach)}]"))
        if problems:
            raise PydanticCustomError("spec_references", "{count} problems with the monitor", {"count": len(problems), "problems": problems})
        return self

    def threshold_ns(self) -> int | None:
        """The fixed threshold, or None for a quantile."""
        return None if _QUANTILE.match(self.threshold) else parse_duration_ns(self.threshold)

    def threshold_quantile(self) -> float | None:
        m = _QUANTILE.match(self.threshold)
        return float(m.group(1)) / 100 if m else None


class KernelCapture(Model):
    """Kernel events (scheduler, interrupts, page faults, timers, network receive) recorded during the
    run on every kernel that allows it (tracepoints into a trace instance of the run's own, CLOCK_MONOTONIC,
    read between probe windows), to explain outliers."""

    # YAML reads a bare on/off as true/false: take them as the words they were
    capture: OnOff = Field("auto", description="auto: when tracefs and the privileges are there (the run says when not); on: refuse to run without it")
    events: list[str] | None = Field(None, description="tracepoints as subsystem:name (default: the set attribution uses)")
    buffer_mb: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        None, description="kernel ring buffer per CPU, in MiB (default: twice what the longest probe window is expected to record)"
    )
    read: Literal["between-windows", "continuously"] = Field(
        "between-windows",
        description="between-windows: the reader runs between probe windows (and in one only when a buffer is half full); continuously: it reads whenever there are events, at SCHED_IDLE (for comparison)",
    )
