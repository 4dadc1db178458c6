"""The ``rr`` kind: request/response exchanges between two hosts, over UDP
or one TCP connection (Boie & Niehaus 2007 §3.2's stimulus-response).

The client on ``host`` sends requests at ``rate`` to ``dest``; the echo
server there (started by the lab when ``dest`` names a host, else one you
run: ``loopscope probe echo``) answers each at once with its kernel RX,
read and send times. Every exchange gives:

- the round trip, on the client's clock alone;
- both one-way legs (client send → server kernel RX, server send → client
  kernel RX) on the run's timeline: each host's CLOCK_REALTIME placed by
  the clock-sync probes, with the two ends' sync bounds added as the leg's
  error (0 on one host);
- the IPDV of each leg (RFC 3393: the difference between consecutive
  exchanges' one-way delays), which needs no clock sync: an offset between
  the clocks cancels in the difference.

The native loops are ``crates/probes/src/net/rr.rs`` (UDP) and
``rr_tcp.rs`` (TCP, length-framed).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import polars as pl
from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Columns, Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.fields import ENDPOINT
from loopscope.rundir import Step
from loopscope.kinds.base import ProbeKind, RunFiles, Series, StepContext, StepRows, Tag, WindowSource, groups, no_windows, wait_windows
from loopscope.probes.params import EchoParams, RrParams
from loopscope.spec.models import Duration, Name, ProbeModel
from loopscope.report import charts

COLUMNS: Columns = {
    "seq": pl.Int64,
    "t_ns": pl.Int64,
    "rtt_ns": pl.Int64,
    "fwd_ns": pl.Int64,
    "ret_ns": pl.Int64,
    "fwd_bound_ns": pl.Float64,
    "ret_bound_ns": pl.Float64,
    "turnaround_ns": pl.Int64,
    "ipdv_fwd_ns": pl.Int64,
    "ipdv_ret_ns": pl.Int64,
    "client": pl.String,
    "server": pl.String,
}


class RrProbe(RrParams, ProbeModel):
    """Request/response between two hosts: round-trip time, both one-way legs on the run's timeline (with their sync bound) and their IPDV (RFC 3393)."""

    kind: Literal["rr"]
    host: Name | None = Field(None, description="the host of the client (default: the first host)")
    # the file's dest may name a host of the experiment (the lab then starts the echo server and launches the client with its HOST:PORT)
    dest: str = Field(
        description="a host of the experiment (the lab starts an echo server there) or HOST:PORT of an echo server you run (loopscope probe echo)"
    )
    port: Annotated[int, Field(ge=1024, le=65000)] = Field(47300, description="the echo server's port when dest names a host")
    duration: Duration | None = Field(None, description="this probe's time per phase (default: the experiment's duration)")
    talks_across_hosts: ClassVar[bool] = True

    @field_validator("dest")
    @classmethod
    def _dest(cls, v: str) -> str:
        m = ENDPOINT.match(v)
        if ":" in v and (m is None or not 1 <= int(m["port"]) <= 65535):
            raise PydanticCustomError("rr_dest", "must be a host of the experiment or HOST:PORT with a port 1..65535", {})
        if ":" not in v and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", v):
            raise PydanticCustomError("rr_dest", "must be a host of the experiment or HOST:PORT", {})
        return v

    @property
    def server_host(self) -> str | None:
        """The experiment's host that answers (None: an outside server)."""
        return None if ":" in self.dest else self.dest

    def host_refs(self) -> list[tuple[tuple[str | int, ...], str | None]]:
        return [(("host",), self.host), (("dest",), self.server_host)]

    def hosts(self, first: str) -> list[str]:
        return list(dict.fromkeys([self.host or first, *([self.server_host] if self.server_host else [])]))


def decode(trace: pl.DataFrame) -> np.ndarray:
    """The client's ``net/rr`` events as rows of seq, sent, server kernel RX,
    server RX, server TX, kernel RX, RX (CLOCK_REALTIME ns)."""
    ev = trace.filter((pl.col("group").cast(pl.String) == "net") & (pl.col("name").cast(pl.String) == "rr"))
    pay = [p for p in ev["payload"].to_list() if p is not None and len(p) >= 56] if len(ev) else []
    if not pay:
        return np.zeros((0, 7), dtype=np.int64)
    return np.frombuffer(b"".join(p[:56] for p in pay), dtype="<i8").reshape(len(pay), 7)


def ipdv(seq: np.ndarray, d: np.ndarray) -> np.ndarray:
    """RFC 3393 IPDV: for each exchange whose predecessor (seq − 1) was also
    answered, its one-way delay minus the predecessor's; else missing."""
    out = np.full(len(d), np.nan)
    if len(d) > 1:
        ok = np.diff(seq) == 1
        out[1:][ok] = np.diff(d)[ok]
    return out


def leg_names(probe: dict[str, Any], first: str) -> tuple[str, str]:
    a = probe.get("host") or first
    b = probe["dest"] if ":" not in probe["dest"] else probe["dest"].rpartition(":")[0]
    return f"{a}→{b}", f"{b}→{a}"


class Rr(ProbeKind[RrProbe]):
    name = "rr"
    model = RrProbe
    describe = (
        "Request/response exchanges: the round trip on the client's clock, both one-way legs on the run's timeline (each with the sum of its two "
        "ends' clock-sync bounds) and each leg's IPDV (RFC 3393: the change of one-way delay between consecutive exchanges; a clock offset cancels in it)."
    )
    tables = {"rr": COLUMNS}
    records = (("rr", "'rtt'", "rtt_ns"), ("rr", "'fwd'", "fwd_ns"), ("rr", "'ret'", "ret_ns"))
    steady = (("rr", "rtt_ns", ()),)
    summary = frozenset({"rtt", "fwd", "ret"})
    labels = {"rtt": "round trip", "fwd": "forward leg", "ret": "return leg", "ipdv_fwd": "forward IPDV (|ΔD|)", "ipdv_ret": "return IPDV (|ΔD|)"}
    params = RrParams
    helpers = {"rr-echo": EchoParams}
    threads = frozenset({"ls-rr", "ls-echo"})

    def run(self, ctx: StepContext, probe: RrProbe, key: str, dur_ns: int) -> dict[str, object]:
        srv = probe.server_host
        spec = probe.model_dump(mode="json")
        if srv is None:
            return {**ctx.run_one(probe, spec, key, dur_ns), "server": {"host": None, "address": probe.dest}}
        h = ctx.hosts[srv]
        name = f"{probe.name}.echo"
        spec["dest"] = h.at(probe.port)  # the client is launched with the server's HOST:PORT
        with ctx.helpers(key) as hs:
            hs.start(srv, {"kind": "rr-echo", "name": name, "bind": h.bind(probe.port), "transport": probe.transport}, wait_ready=True)
            step = ctx.run_one(probe, spec, key, dur_ns)
            echo = hs.stop(srv, name)
        return {
            **step,
            "server": {
                "host": srv,
                "address": spec["dest"],
                "name": name,
                "json": echo.json,
                "answered": echo.result.get("requests"),
                "cpu_usec": echo.cpu_usec,
                "tids": echo.result.get("tids"),
            },
        }

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        a = decode(trace)
        out = StepRows()
        if not len(a):
            return out
        a = a[np.argsort(a[:, 0], kind="stable")]
        seq, sent, skrx, surx, sutx, krx, urx = (a[:, i] for i in range(7))
        client = step.host or ""
        server = step.server.host if step.server else None
        if server is None:
            addr = step.server.address if step.server else ""
            server = client if addr.startswith("127.") else ""
        base = int(sent[0])
        n = len(a)
        ha, hb = np.full(n, client, dtype=object), np.full(n, server, dtype=object)
        fwd, fb = read.place(ha, (sent - base).astype(np.float64), hb, (skrx - base).astype(np.float64), base)
        ret, rb = read.place(hb, (sutx - base).astype(np.float64), ha, (krx - base).astype(np.float64), base)
        if not server:  # an outside server on an unknown clock: no legs
            fwd, ret = np.full(n, np.nan), np.full(n, np.nan)
        df = pl.DataFrame(
            {
                "seq": seq,
                "t_ns": sent,
                "rtt_ns": urx - sent,
                "fwd_ns": pl.Series(fwd).fill_nan(None).round(0).cast(pl.Int64),
                "ret_ns": pl.Series(ret).fill_nan(None).round(0).cast(pl.Int64),
                "fwd_bound_ns": pl.Series(fb).fill_nan(None),
                "ret_bound_ns": pl.Series(rb).fill_nan(None),
                "turnaround_ns": sutx - surx,
                "ipdv_fwd_ns": pl.Series(ipdv(seq, (skrx - sent).astype(np.float64))).fill_nan(None).cast(pl.Int64),
                "ipdv_ret_ns": pl.Series(ipdv(seq, (krx - sutx).astype(np.float64))).fill_nan(None).cast(pl.Int64),
                "client": client,
                "server": server or None,
            },
            schema_overrides={"server": pl.String},
        )
        out.add("rr", tag(df))
        return out

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """Both ends' kernel-to-application waits: the client's thread reading
        each answer (``<probe> client (<host>)``), and the echo server's
        reading each request (``<probe> server (<host>)``, when the lab ran
        it and it shares the client's kernel, so the client's calibration
        places the server's CLOCK_REALTIME stamps: time namespaces do not
        shift CLOCK_REALTIME)."""
        df = src.trace(step.trace) if step.trace else None
        if df is None:
            return no_windows()
        a = decode(df)
        if not len(a):
            return no_windows()
        client = src.host_of(step)
        ev = df.filter((pl.col("group").cast(pl.String) == "net") & (pl.col("name").cast(pl.String) == "rr"))
        out = [wait_windows(step, src, step.trace, a[:, 5], a[:, 6], int(ev["tid"].mode()[0]), client, f"{step.probe} client ({client})")]
        srv = step.server
        tids = (srv.tids if srv else None) or []
        if srv and srv.host and len(tids) == 1 and src.same_kernel(client, srv.host):
            # placed by the client's calibration, so on the client's clock (its host's offset takes them to the kernel's)
            out.append(wait_windows(step, src, step.trace, a[:, 2], a[:, 3], int(tids[0]), client, f"{step.probe} server ({srv.host})"))
        return pl.concat(out)

    def measures(self, tables: Tables) -> list[Measure]:
        out = []
        for probe, g in groups(tables.rr):
            for m, col in (
                ("rtt", pl.col("rtt_ns")),
                ("fwd", pl.col("fwd_ns")),
                ("ret", pl.col("ret_ns")),
                ("ipdv_fwd", pl.col("ipdv_fwd_ns").abs()),
                ("ipdv_ret", pl.col("ipdv_ret_ns").abs()),
            ):
                v = g.select("rep", "phase", "loads", col.alias("value")).drop_nulls("value")
                if len(v):
                    out.append(Measure(probe, "rr", m, v, ("p50", "p99", "mean"), 32))
        return out

    def series(self, tables: Tables, probe: str) -> list[Series]:
        df = tables.rr.filter(pl.col("probe") == probe)
        spec = next((p for p in tables.spec.get("probes") or [] if p.get("name") == probe), {"dest": "?"})
        there, back = leg_names(spec, tables.run.first_host)
        return [
            Series("rtt", "round trip", df.select("rep", "phase", "t_ns", pl.col("rtt_ns").alias("value"))),
            *(
                Series(
                    m,
                    f"{label} one-way delay",
                    df.select("rep", "phase", "t_ns", pl.col(f"{m}_ns").alias("value")).drop_nulls("value"),
                    scan=False,
                    charts=False,
                )
                for m, label in (("fwd", there), ("ret", back))
            ),
        ]

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        from loopscope.report.sections import ns

        spec: dict[str, Any] = next((p for p in tables.spec.get("probes") or [] if p.get("name") == sec.name), {})
        first = tables.run.first_host
        there, back = leg_names(spec, first)
        df = tables.rr.filter(pl.col("probe") == sec.name)
        sec.describe += f" Here {spec.get('host') or first} asks {spec.get('dest')} over {spec.get('transport', 'udp').upper()} at {spec.get('rate')}."
        rows = []
        for ph in present:
            g = df.filter(pl.col("phase") == ph)
            if not len(g):
                continue

            def q(col: str, bound: str | None = None) -> str:
                v = g[col].drop_nulls()
                if not len(v):
                    return "n/a (no shared clock)" if bound else "n/a"
                text = f"{ns(v.quantile(0.5))} / {ns(v.quantile(0.99))}"
                if bound:
                    b = g[bound].drop_nulls()
                    text += f" ± {ns(float(b.median()))}" if len(b) else ""  # type: ignore[arg-type]
                return text

            iv = [f"{ns(g[c].drop_nulls().abs().quantile(0.99))}" if g[c].drop_nulls().len() else "n/a" for c in ("ipdv_fwd_ns", "ipdv_ret_ns")]
            sent = sum(int((tables.results.get((r, ph, sec.name)) or {}).get("sent") or 0) for r in g["rep"].unique().to_list())
            rows.append(
                [ph, f"{len(g):,} of {sent:,}", q("rtt_ns"), q("fwd_ns", "fwd_bound_ns"), q("ret_ns", "ret_bound_ns"), f"{there} {iv[0]} · {back} {iv[1]}"]
            )
        sec.grids.append(
            {
                "title": "Round trip, legs and IPDV (p50 / p99; legs ± the median sync bound; IPDV: p99 of |ΔD|)",
                "columns": ["phase", "answered", "RTT", there, back, "IPDV"],
                "rows": rows,
            }
        )
        super().section(sec, tables, comp, present, inputs)
        for measure, label in (("fwd", there), ("ret", back)):
            c = comp.filter(pl.col("measure") == measure)
            if len(c):
                legs = df.select("rep", "phase", "t_ns", pl.col(f"{measure}_ns").alias("value")).drop_nulls("value")
                sec.charts.append(
                    charts.ecdf(
                        legs,
                        [p for p in present if p in set(legs["phase"].to_list())],
                        f"{sec.name}: leg {label}, distribution by phase",
                        f"{label} one-way delay",
                    )
                )


KIND = Rr()
