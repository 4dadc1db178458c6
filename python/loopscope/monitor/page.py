"""``loopscope report DIR`` on a monitor: one page in the OSADL latency-plot tradition.

Per probe: the whole run's latency histogram (log counts: the tail is what a
long run is for), the maximum of every period over time with each spike's
top cause, a heat map of the period histograms over time; then the causes of
all kept outliers ranked by their time, and the run's counts (outliers
above the threshold, kept, not kept and why). Built from the directory's
files alone (``monitor.json``, ``periods.jsonl``, ``histograms/*.hlog``,
``outliers.jsonl``) into the report's template ``report/monitor.html.j2``, in
the report's style; inline SVG (``monitor/charts.py``), no JavaScript.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from loopscope.report import templates

from loopscope.dataset.query import Query
from loopscope.dataset.scan import scan
from loopscope.kinds import KINDS
from loopscope.monitor import hist
from loopscope.report import fleet as fleet_page
from loopscope.rundir import monitor as record
from loopscope.monitor import charts
from loopscope import __version__
from loopscope.units import format_ns, parse_duration_ns


def build_all(d: Path) -> list[Path]:
    """The monitor's page, and for a monitor of several hosts the fleet's
    page too (``d/fleet.html``: hosts × hours, causes by host and kernel, the
    worst outliers); their paths."""
    out = [build(d)]
    hosts = {p.get("host") for p in (record.read(d).get("probes") or {}).values()}
    if len(hosts - {None}) > 1:
        q = Query(scan(str(d)), lambda: [r for k in KINDS for r in k.records], reuse=True)
        f = d / "fleet.html"
        f.write_text(fleet_page.page(q, d))
        out.append(f)
    return out


def build(d: Path) -> Path:
    """Write ``d/report.html`` from the report's template ``monitor.html.j2``; its path."""
    rec = record.read(d)
    periods = record.periods(d)
    outl = record.outliers(d)
    thr = str(rec["settings"].get("threshold") or "")
    try:
        thr_ns: int | None = parse_duration_ns(thr) if thr and not thr.startswith("p") else None
    except ValueError:
        thr_ns = None
    probes = []
    for name, p in (rec.get("probes") or {}).items():
        log = d / "histograms" / f"{name}.hlog"
        hs = hist.read_log(log) if log.exists() else []
        probes.append(
            {
                "name": name,
                "count": p.get("count", 0),
                "periods": p.get("periods", 0),
                "p99": format_ns(p.get("p99_ns") or 0),
                "p999": format_ns(p.get("p999_ns") or 0),
                "max": format_ns(p.get("max_ns") or 0),
                "max_at_utc": str(p.get("max_at_utc")),
                "unmeasured_s": f"{p.get('unmeasured_s', 0):g}",
                "missed": p.get("missed", 0),
                "charts": charts.probe_charts(name, hs, periods, outl, thr_ns),
            }
        )
    c = rec.get("counts", {})
    counts = {k: c.get(k, 0) for k in ("outliers_above", "kept", "explained", "windows", "windows_removed")}
    nk = c.get("not_kept") or {}
    page = templates.template("monitor.html.j2").render(
        css=templates.css(),
        rec=rec,
        period=str(rec.get("settings", {}).get("period")),
        threshold=thr,
        counts=counts,
        not_kept=", ".join(f"{k}: {v}" for k, v in nk.items()) or "0",
        probes=probes,
        causes=_causes(outl),
        version=__version__,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )
    out = d / "report.html"
    out.write_text(page)
    return out


def _causes(outl: list[record.OutlierLine]) -> list[dict[str, str | int]]:
    """The causes of the kept outliers, ranked by their time, with how many outliers each tops."""
    tot: dict[str, int] = {}
    n: dict[str, int] = {}
    for o in outl:
        for x in o.get("causes") or []:
            tot[x["cause"]] = tot.get(x["cause"], 0) + int(x["ns"])
        if top := o.get("top_cause"):
            n[top] = n.get(top, 0) + 1
    all_ns = sum(tot.values()) or 1
    return [{"cause": k, "time": format_ns(v), "share": f"{v / all_ns:.1%}", "tops": n.get(k, 0)} for k, v in sorted(tot.items(), key=lambda kv: -kv[1])]
