"""Kernel capture across a lab: one ``perf record`` per kernel.

Netns and local hosts share this machine's kernel, so the first of them
records for all; every ssh host records its own. The captures start once the
agents are up (after the clock-sync probes) and stop after the last phase;
their files live in ``hosts/<name>/kernel/`` and ``run.json`` lists them
under ``kernel`` with the hosts each one covers, what it recorded, what the
kernel lacked and what perf cost. A refusal (no perf, no tracefs, no
privilege) is a note in the run with ``capture: auto`` and an error with
``capture: on``.
"""

from __future__ import annotations

from typing import Any

from loopscope.lab.hosts import AgentFailure


def kernels(lab: Any) -> list[tuple[str, list[str]]]:
    """(host that records, hosts its kernel serves)."""
    local = [h.name for h in lab.hosts.values() if not h.remote]
    out = [(local[0], local)] if local else []
    out += [(h.name, [h.name]) for h in lab.hosts.values() if h.remote]
    return out


def start(lab: Any, exp: Any, notes: list[str]) -> dict[str, Any]:
    k = exp.kernel
    info: dict[str, Any] = {"captures": [], "running": []}
    for host, covers in kernels(lab):
        out_dir = f"{lab.hosts[host].base}/kernel"
        meta = lab.agent(host).call("start_kcapture", out_dir=out_dir, events=k.events, buffer_pages=k.buffer_pages)
        entry = {"host": host, "covers": covers, "dir": lab.rel(host, out_dir), **{x: meta.get(x) for x in ("tool", "events", "missing_events", "refused", "clock", "timens_offset_ns")}}
        if meta.get("refused"):
            msg = f"kernel capture on {host} ({', '.join(covers)}): {meta['refused']}; the report cannot say why outliers happened there"
            if k.capture == "on":
                raise AgentFailure(msg, host=host, component="kernel capture")
            notes.append(msg)
        else:
            info["running"].append(host)
            if meta.get("missing_events"):
                notes.append(f"kernel capture on {host}: this kernel lacks {', '.join(meta['missing_events'])}")
        info["captures"].append(entry)
    return info


def stop(lab: Any, info: dict[str, Any], quiet: bool = False) -> None:
    for host in list(info.get("running") or []):
        try:
            meta = lab.agent(host).call("stop_kcapture", timeout=60)
            entry = next(e for e in info["captures"] if e["host"] == host)
            entry.update({"seconds": meta.get("seconds"), "perf_cpu_s": meta.get("perf_cpu_s")})
            if meta.get("data"):
                entry["data"] = lab.rel(host, meta["data"])
                entry["log"] = lab.rel(host, meta["log"])
        except AgentFailure:
            if not quiet:
                raise
        entry = next(e for e in info["captures"] if e["host"] == host)
        if "data" not in entry and not lab.hosts[host].remote:
            # The agent stopped perf itself (Ctrl-C reaches it too): what perf wrote is still there.
            from pathlib import Path

            f = Path(lab.hosts[host].base) / "kernel" / "kernel.perf"
            if f.exists() and f.stat().st_size:
                entry["data"] = lab.rel(host, str(f))
                entry["log"] = lab.rel(host, str(f.with_name("perf.log")))
        info["running"].remove(host)


def public(info: dict[str, Any]) -> dict[str, Any]:
    return {"captures": info["captures"]}
