"""The link emulator as a lab component.

``path_plan`` decides, per ordered pair of netns hosts, what carries the
path: the router's kernel (IP forwarding, the same path as two machines
behind a real router) when no phase of the experiment asks that direction
for anything, the emulator when any phase asks for delay, jitter, rate,
reorder, loss or duplication. The choice holds for the whole run, so a
phase that changes a link never moves it between mechanisms mid-run, and
the emulator never wakes for a packet it does not change (its sockets
filter those out in the kernel).

``link_configs`` turns the experiment's links into the emulator's per
direction settings; ``Emulator`` starts ``loopscope netem`` inside the
router namespace (so its AF_PACKET sockets see the router's interfaces),
waits for it to say ``ready`` (its interfaces are open: from then on no
frame is missed), checks it is alive while the run goes on, and stops it
with SIGINT so it writes its counts and histograms as JSON. ``summarize``
turns those into what the report shows per link: packets in and out, what
was lost, duplicated, reordered or dropped at the queue limit, and the
delay the emulator applied and its own lateness, each as p50/p99/max with
the histogram bucket as the error.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from pydantic import ValidationError

from loopscope.host import procs
from loopscope.errors import RunError
from loopscope.rundir import EMULATOR_RESULT, EmulatorResult, LinkCounts, PathRecord
from loopscope.units import duration_text
from loopscope.units import parse_rate
from loopscope import _native

if TYPE_CHECKING:
    from loopscope.spec.models import Experiment
    from loopscope._native import _NetemRun as NetemRun

MECHANISM = "loopscope user-space emulator (AF_PACKET forwarding in the router namespace; the kernel has no netem)"
KERNEL_MECHANISM = "kernel IP forwarding in the router namespace (no emulation asked)"


def _asks(link: Any) -> list[str]:
    """What a link asks of the path beyond plain forwarding."""

    out = []
    if link.delay:
        out.append(f"delay {duration_text(link.delay)}")
    if link.jitter:
        out.append(f"jitter {duration_text(link.jitter)}")
    if link.rate:
        out.append(f"rate {link.rate}")
    for k in ("loss", "duplicate", "reorder"):
        if getattr(link, k):
            out.append(f"{k} {getattr(link, k):g}%")
    return out


#: one direction of a link as the emulator is configured with it (the units it takes: ns, fractions, bits/s)
LinkConfig = TypedDict(
    "LinkConfig",
    {
        "name": str,
        "spec_index": int,
        "from": str,
        "to": str,
        "delay_ns": int,
        "jitter_ns": int,
        "distribution": str,
        "loss": float,
        "duplicate": float,
        "reorder": float,
        "rate_bps": "float | None",
        "limit": "int | None",
    },
)


def path_plan(exp: Experiment, hosts: list[str]) -> dict[str, PathRecord]:
    """Every ordered pair of ``hosts`` by ``a->b``: what carries it
    (``kernel`` or ``emulator``) and why."""
    asked: dict[tuple[str, str], list[str]] = {}
    sources = [("", l) for l in exp.links] + [(f"phase {ph.name}: ", l) for ph in (getattr(exp, "phases", None) or []) for l in (ph.links or [])]
    for where, link in sources:
        for d in link.directions():
            asked.setdefault(d, []).extend(f"{where}{a}" for a in _asks(link))
    plan = {}
    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            why = asked.get((a, b)) or []
            plan[f"{a}->{b}"] = PathRecord.model_validate(
                {
                    "from": a,
                    "to": b,
                    "mechanism": "emulator" if why else "kernel",
                    "why": ("asks for " + ", ".join(dict.fromkeys(why))) if why else "nothing asked in any phase",
                }
            )
    return plan


def link_configs(exp: Experiment, phase: Any = None) -> list[LinkConfig]:
    """One entry per direction of every link in the experiment file (with
    ``phase``: as that phase changes them)."""

    links = list(exp.links)
    for over in getattr(phase, "links", None) or []:
        dirs = set(over.directions())
        links = [over if set(l.directions()) & dirs else l for l in links]
    out: list[LinkConfig] = []
    for i, link in enumerate(links):
        rate = parse_rate(link.rate)[0] if link.rate else None
        for a, b in link.directions():
            out.append(
                {
                    "name": f"{a}->{b}",
                    "spec_index": i,
                    "from": a,
                    "to": b,
                    "delay_ns": link.delay,
                    "jitter_ns": link.jitter,
                    "distribution": link.distribution,
                    "loss": link.loss / 100,
                    "duplicate": link.duplicate / 100,
                    "reorder": link.reorder / 100,
                    "rate_bps": rate,
                    "limit": link.limit,
                }
            )
    return out


class EmulatorFailure(RunError):
    """The link emulator did not start or stopped; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, component="link emulator")


class Emulator:
    """``loopscope netem`` running in the router namespace."""

    def __init__(self, router_ns: str, config: Mapping[str, object], out_dir: Path, run_id: str, ready_timeout: float = 10.0) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.config_path = out_dir / "netem-config.json"
        self.config_path.write_text(json.dumps(config, indent=1) + "\n")
        self.trace = out_dir / "netem.lstrace"
        self.argv = [
            "ip",
            "netns",
            "exec",
            router_ns,
            sys.executable,
            "-m",
            "loopscope.cli",
            "netem",
            "--config",
            str(self.config_path),
            "--trace",
            str(self.trace),
            "--json",
        ]
        self.child = procs.spawn(
            "netem", "link emulator", self.argv, out_dir / "netem.log", None, procs.child_env(run_id, {"LOOPSCOPE_COMM": "ls-netem"}), stdout_pipe=True
        )
        self.result: EmulatorResult | None = None
        assert self.child.popen.stdout is not None
        fd = self.child.popen.stdout.fileno()
        end = time.monotonic() + ready_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = end - time.monotonic()
            r, _, _ = select.select([fd], [], [], max(0.0, left))
            if not r:
                self.kill()
                raise EmulatorFailure(self.child.describe_failure(f"the link emulator did not become ready within {ready_timeout:.0f} s"))
            b = os.read(fd, 1)
            if not b:
                self.child.popen.wait()
                raise EmulatorFailure(self.child.describe_failure("the link emulator exited while starting"))
            line += b
        if line.strip() != b"ready":
            self.kill()
            raise EmulatorFailure(self.child.describe_failure(f"the link emulator said {line.strip()!r} instead of ready"))

    def reconfigure(self, config: Mapping[str, object], timeout: float = 5.0) -> None:
        """New link settings while it runs (a phase that changes a link):
        rewrite the configuration, signal it, wait for it to say it took them."""
        self.config_path.write_text(json.dumps(config, indent=1) + "\n")
        self.child.popen.send_signal(signal.SIGUSR1)
        assert self.child.popen.stdout is not None
        fd = self.child.popen.stdout.fileno()
        end = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            r, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not r:
                raise EmulatorFailure(self.child.describe_failure(f"the link emulator did not take the new link settings within {timeout:.0f} s"))
            b = os.read(fd, 1)
            if not b:
                raise EmulatorFailure(self.child.describe_failure("the link emulator exited while taking new link settings"))
            line += b
        if not line.startswith(b"reloaded"):
            raise EmulatorFailure(self.child.describe_failure(f"the link emulator said {line.strip()!r} instead of reloaded"))

    def check(self) -> None:
        if self.child.popen.poll() is not None:
            raise EmulatorFailure(self.child.describe_failure("the link emulator exited during the run"))

    def stop(self, timeout: float = 10.0) -> EmulatorResult | None:
        p = self.child.popen
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        text = out.decode(errors="replace").strip()
        for line in reversed(text.splitlines()):
            if line.startswith("{"):
                try:
                    self.result = EMULATOR_RESULT.validate_json(line)
                except ValidationError:
                    break
                (self.out_dir / "netem.json").write_text(line + "\n")
                break
        return self.result

    def kill(self) -> None:
        p = self.child.popen
        if p.poll() is None:
            p.kill()
            p.wait()


def run_emulator(config_path: str, trace_path: str | None) -> EmulatorResult:
    """The body of ``loopscope netem``: forward until SIGINT/SIGTERM, then summarize."""
    from loopscope.probes.common import envelope, traced

    config = Path(config_path).read_text()
    with traced(trace_path, ["netem"]) as tr:
        sys.stdout.flush()
        r = _native.netem_run(config, ready_fd=sys.stdout.fileno(), reload_path=str(Path(config_path).resolve()))
    out: EmulatorResult = {**envelope("netem"), **summarize(r), "trace": {"path": tr.path, "records": tr.records, "lost": tr.lost}}
    return out


def summarize(r: NetemRun) -> EmulatorResult:
    from loopscope.probes.net import hist_quantiles

    scale = r["hist_scale"]
    links: list[LinkCounts] = []
    for l in r["links"]:
        links.append(
            {
                "name": l["name"],
                "from": l["from"],
                "to": l["to"],
                "configured": l["configured"],
                "kernel": l["kernel"],
                "packets_in": l["packets_in"],
                "bytes_in": l["bytes_in"],
                "forwarded": l["forwarded"],
                "lost": l["lost"],
                "duplicated": l["duplicated"],
                "reordered": l["reordered"],
                "queue_drops": l["queue_drops"],
                "send_errors": l["send_errors"],
                "pending_at_stop": l["pending_at_stop"],
                "applied_ns": hist_quantiles(l["applied"], scale),
                "late_ns": hist_quantiles(l["late"], scale),
                "queued_ns": hist_quantiles(l["queued"], scale),
            }
        )
    return {
        "mechanism": MECHANISM,
        "links": links,
        "ports": r["ports"],
        "elapsed_ns": r["elapsed_ns"],
        "interrupted": r["interrupted"],
        "final_margin_ns": r["final_margin_ns"],
        "sleeps": r["sleeps"],
        "priority": r["priority"],
        "policy": r["policy"],
        "reload_errors": r["reload_errors"],
        "unfiltered": r["unfiltered"],
        "wait": r["wait"],
        "cpu_note": r["cpu_note"],
        "cpu_ns": r["cpu_ns"],
        "cpu_share": r["cpu_ns"] / r["elapsed_ns"] if r["elapsed_ns"] else None,
    }
