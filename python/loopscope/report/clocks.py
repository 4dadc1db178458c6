"""The report's Clocks section: per host, its clock's offset, drift and
bound against the reference, the probes the estimate rests on, how the
machine disciplines its clock, and what went wrong; with its chart.
"""

from __future__ import annotations

import polars as pl

from loopscope.report import charts
from loopscope.report.sections import ns as _ns
from loopscope.report.view import ClockRow
from loopscope.rundir import ClockDiscipline, ClockSyncRecord, Provenance
from loopscope.timeline import TimelineDoc


def discipline_text(d: ClockDiscipline | None) -> str:
    """One line on what disciplines a host's CLOCK_REALTIME (provenance ``clock_discipline``)."""
    if not d:
        return "not recorded"
    k = d.kernel
    parts = []
    if k:
        parts.append(
            f"kernel {'synchronised' if k.synchronised else 'unsynchronised'} ({k.state}), frequency {k.frequency_ppm:+.3f} ppm, estimated error {_ns(k.est_error_us * 1000)}"
        )
    c = d.chrony
    if c and c.reference is not None:
        parts.append(
            f"chrony: {c.reference} stratum {c.stratum}, offset {(c.system_time_offset_s or 0) * 1e6:+.1f} µs, rms {(c.rms_offset_s or 0) * 1e6:.1f} µs"
        )
    elif c:
        parts.append(f"chrony: {c.note}")
    parts.append("daemons: " + (", ".join(d.daemons) or "none"))
    return "; ".join(parts)


def network(cs: ClockSyncRecord | None) -> str:
    """One sentence on the network the clock-sync probes crossed."""
    if not cs:
        return ""
    by = {h: i.network for h, i in cs.initiators.items()}
    if not by or not any(by.values()):
        return "The probes crossed the experiment's network (its router and links)."
    text = {
        "sync": "the sync network (a link of their own to the reference, no router, no emulation)",
        "experiment": "the experiment's network (its router and links)",
    }
    nets = set(by.values())
    if len(nets) == 1:
        only = nets.pop()
        return f"The probes crossed {text.get(only or '', only)}."
    return "The probes crossed " + "; ".join(f"for {h}, {text.get(n or '', n)}" for h, n in sorted(by.items())) + "."


def _signed(x: float) -> str:
    """An offset with its sign, in the unit that suits it (+234 ns, −1.20 ms)."""
    return ("+" if x >= 0 else "−") + _ns(abs(x))


def section(tl: TimelineDoc | None, clock_series: pl.DataFrame | None, prov: Provenance | None = None) -> tuple[list[ClockRow], str | None, list[str]]:
    """Rows of the Clocks section, its chart, and what went wrong."""

    clock = tl.get("clock") if tl else None
    if not tl or not clock:
        return [], None, []
    rows: list[ClockRow] = []
    problems: list[str] = []
    for host, h in clock["hosts"].items():
        if host == "router":
            continue
        placed = tl.get("hosts", {}).get(host) or {"records": 0, "placed": 0, "not_placed": 0}
        ok = [w for w in h["windows"] if w["offset_ns"] is not None]
        p = h["probes"]
        if h["reference"]:
            rows.append(
                {
                    "host": host,
                    "mono": "reference",
                    "real": "",
                    "drift": "",
                    "bound": "0",
                    "windows": "",
                    "probes": "",
                    "lost": "",
                    "rtt": "",
                    "pure": "",
                    "placed": f"{placed.get('placed', 0):,} / {placed.get('records', 0):,}",
                }
            )
        else:
            w = ok[len(ok) // 2] if ok else None
            mo = w and w.get("monotonic_offset_ns")
            rows.append(
                {
                    "host": host,
                    "mono": (f"{mo / 1e9:+.9f} s" if abs(mo) >= 1e8 else _signed(mo)) if mo is not None else "n/a",
                    "real": _signed(w["offset_ns"]) if w and w["offset_ns"] is not None else "n/a",
                    "drift": f"{w['drift_ppm']:+.3f} ppm [{w['drift_lo_ppm']:+.3f}, {w['drift_hi_ppm']:+.3f}]"
                    if w and w["drift_lo_ppm"] is not None
                    else (f"{w['drift_ppm']:+.3f} ppm" if w else "n/a"),
                    "bound": f"±{_ns(w['bound_mid_ns'])} (max {_ns(max(x['bound_max_ns'] or 0 for x in ok))})" if w else "none",
                    "windows": f"{len(ok)} of {len(h['windows'])}",
                    "probes": f"{p.get('used_there', 0) + p.get('used_back', 0):,}",
                    "lost": f"{p.get('lost_there', 0)} / {p.get('lost_back', 0)}",
                    "rtt": _ns(p.get("min_rtt_ns")),
                    "pure": f"{p.get('pure_there', 0):,} / {p.get('pure_back', 0):,}",
                    "placed": f"{placed.get('placed', 0):,} / {placed.get('records', 0):,}",
                }
            )
        machine = prov.hosts.get(host) if prov is not None else None
        rows[-1]["discipline"] = discipline_text(machine.clock_discipline if machine is not None else None)
        problems += [f"{host}: {x}" for x in h["problems"]]
    for c in (tl.get("checks") or {}).get("pipeline") or []:
        if c.get("negative_beyond_bound"):
            problems.append(
                f"{c['probe']} hop {c['hop']} ({c['from']} → {c['to']}, {c['phase']}, rep {c['rep']}): {c['negative_beyond_bound']} messages arrive before they left by more than the bound"
            )
    chart = charts.clock_chart(clock_series) if clock_series is not None and len(clock_series) else None
    return rows, chart, problems
