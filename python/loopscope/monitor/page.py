"""``loopscope report DIR`` on a monitor: one page in the OSADL latency-plot tradition.

Per probe: the whole run's latency histogram (log counts: the tail is what a
long run is for), the maximum of every period over time with each spike's
top cause, a heat map of the period histograms over time; then the causes of
all kept outliers ranked by their time, and the run's counts (outliers
above the threshold, kept, not kept and why). Built from the directory's
files alone (``monitor.json``, ``periods.jsonl``, ``histograms/*.hlog``,
``outliers.jsonl``) into the report's template ``report/monitor.html.j2``, in
the report's style; inline SVG, no JavaScript.
"""

from __future__ import annotations

import datetime as _dt
import io
import re
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from loopscope.dataset.query import Query
from loopscope.dataset.scan import scan
from loopscope.kinds import KINDS
from loopscope.monitor import hist
from loopscope.report import fleet as fleet_page
from loopscope.rundir import monitor as record
from loopscope import lazy
from loopscope.report.svg import MANY
from loopscope import __version__
from loopscope.units import format_ns, parse_duration_ns

# latency bins for the histogram and the heat map: 8 per factor of ten, 100 ns to 100 s
EDGES = np.logspace(2, 11, 73)


def _counts(h: Any) -> np.ndarray:
    """A histogram's counts in ``EDGES`` bins."""
    out = np.zeros(len(EDGES) - 1)
    for item in h.get_recorded_iterator():
        i = int(np.clip(np.searchsorted(EDGES, item.value_iterated_to, side="right") - 1, 0, len(out) - 1))
        out[i] += item.count_at_value_iterated_to
    return out


def _span(rows: list[record.PeriodLine]) -> tuple[np.ndarray, np.ndarray, str]:
    """Each period's start and end since the first one started, in seconds,
    minutes or hours as the monitor's length reads best; and the unit."""
    t = [(_dt.datetime.fromisoformat(r["start_utc"]).timestamp(), _dt.datetime.fromisoformat(r["end_utc"]).timestamp()) for r in rows]
    t0 = min(a for a, _ in t)
    total = max(b for _, b in t) - t0
    div, unit = (1.0, "seconds") if total < 120 else ((60.0, "minutes") if total < 7200 else (3600.0, "hours"))
    return np.array([(a - t0) / div for a, _ in t]), np.array([(b - t0) / div for _, b in t]), unit


def _svg(fig: Any) -> str:
    """``fig`` as an inline SVG whose ids do not clash with another chart's on the page."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    lazy.pyplot().close(fig)
    s = buf.getvalue()
    s = s[s.index("<svg") :]
    tag = f"c{id(buf) & 0xFFFFFF:x}"
    s = re.sub(r'id="([^"]+)"', lambda m: f'id="{tag}{m.group(1)}"', s)
    s = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{tag}{m.group(1)})", s)
    return re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{tag}{m.group(1)}"', s)


def _probe_charts(name: str, hs: list[Any], periods: list[record.PeriodLine], outl: list[record.OutlierLine], thr_ns: int | None) -> list[str]:
    plt = lazy.pyplot()
    rows = [r for r in periods if r["probe"] == name]
    per = np.array([_counts(h) for h in hs]) if hs else np.zeros((0, len(EDGES) - 1))
    whole = per.sum(axis=0) if len(per) else np.zeros(len(EDGES) - 1)
    parts = []
    # the bins that hold values, and a little either side
    nz = np.nonzero(whole)[0]
    lo, hi = (max(0, int(nz[0]) - 2), min(len(whole), int(nz[-1]) + 3)) if len(nz) else (0, len(whole))
    # 1. the whole run's histogram
    fig, ax = plt.subplots(figsize=(9, 3.2))
    mid = np.sqrt(EDGES[:-1] * EDGES[1:]) / 1e3
    ax.bar(mid[lo:hi], whole[lo:hi], width=np.diff(EDGES)[lo:hi] / 1e3, align="center", color="#1f5fa8", log=True)
    ax.set_xscale("log")
    ax.set_xlabel("latency (µs)")
    ax.set_ylabel("values (log)")
    if thr_ns:
        ax.axvline(thr_ns / 1e3, color="#d9480f", lw=1, ls="--", label=f"threshold {format_ns(thr_ns)}")
        ax.legend()
    ax.set_title(f"{name}: every value of the run ({int(whole.sum()):,})")
    parts.append(_svg(fig))
    # 2. the maximum per period, each spike coloured by its top cause
    if rows:
        by_t = {(o["probe"], o["t_ns"]): o for o in outl}
        starts, ends, unit = _span(rows)
        x = (starts + ends) / 2
        mx = np.array([r.get("max_ns") or 0 for r in rows]) / 1e3
        causes = [
            (o.get("top_cause") if (o := by_t.get((name, r.get("max_t_ns", -1)))) is not None else None)
            or ("below the threshold" if thr_ns and (r.get("max_ns") or 0) <= thr_ns else "not kept")
            for r in rows
        ]
        names = sorted(set(causes), key=causes.index)
        fig, ax = plt.subplots(figsize=(9, 3.2))
        ax.plot(x, mx, color="#adb5bd", lw=0.8, zorder=1)
        for i, c in enumerate(names):
            sel = [j for j, cc in enumerate(causes) if cc == c]
            ax.scatter(x[sel], mx[sel], s=14, color="#ced4da" if c == "below the threshold" else MANY[i % len(MANY)], label=c, zorder=2)
        ax.set_yscale("log")
        ax.set_xlim(0, float(ends.max()))
        ax.set_xlabel(f"{unit} since the first period began (each point at its period's middle)")
        ax.set_ylabel("maximum (µs)")
        ax.legend(fontsize=9, ncol=2)
        ax.set_title(f"{name}: the maximum of each period, by the top cause of the outlier that made it")
        parts.append(_svg(fig))
    # 3. the period histograms over time
    if len(per):
        fig, ax = plt.subplots(figsize=(9, 3.2))
        img = np.log10(per.T[lo:hi] + 1)
        if len(rows) == len(per):
            # each period as wide as it lasted, the time between periods (not measured) left blank
            starts, ends, unit = _span(rows)
            xe = np.ravel(np.column_stack([starts, ends]))
            cols = np.full((hi - lo, 2 * len(per) - 1), np.nan)
            cols[:, 0::2] = img
            ax.pcolormesh(xe, np.arange(lo, hi + 1), cols, cmap="viridis", shading="flat")
            ax.set_xlabel(f"{unit} since the first period began (blank: not measured, between periods)")
        else:
            ax.imshow(img, aspect="auto", origin="lower", cmap="viridis", extent=(0.5, len(per) + 0.5, lo, hi), interpolation="nearest")
            ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
            ax.set_xlabel("period")
        ticks = [i for i in range(lo, hi + 1) if i % 8 == 0] or [lo]
        ax.set_yticks(ticks, [format_ns(EDGES[i]) for i in ticks])
        ax.set_ylabel("latency")
        ax.grid(False)
        ax.set_title(f"{name}: each period's histogram (colour: log count)")
        parts.append(_svg(fig))
    return parts


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
                "charts": _probe_charts(name, hs, periods, outl, thr_ns),
            }
        )
    c = rec.get("counts", {})
    counts = {k: c.get(k, 0) for k in ("outliers_above", "kept", "explained", "windows", "windows_removed")}
    nk = c.get("not_kept") or {}
    here = Path(__file__).resolve().parents[1] / "report"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(here)), autoescape=jinja2.select_autoescape(["html", "j2"]))
    page = env.get_template("monitor.html.j2").render(
        css=(here / "page.css").read_text(),
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
