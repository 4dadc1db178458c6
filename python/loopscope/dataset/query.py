"""SQL over a directory of runs: DuckDB, embedded, reading the runs' files in place.

``Query`` opens an in-memory DuckDB and describes the dataset to it: the
runs and their hosts (``runs``), each run's probes (``probes``), and one view
per table the runs wrote (``timer``, ``comparisons``, ``attribution``, …)
over the runs' own Parquet files (``read_parquet`` of the list, by column
name, so runs whose tables gained columns read together with older ones:
a column a run lacks is null in its rows). Nothing is copied or converted.

Every view starts with the columns that identify a row's run
(``rundir.IDENTITY``), taken from the run records, not from the files, so
runs written before the tables carried them answer the same way: a row's
``host`` is its own (``attribution``, ``stages``), else its probe's, else
the run's first. Two views are built on the others:

- ``summary``: each run's figures, one row per probe, measure, phase and
  metric (p50, p99, p999, max, mean), ``value_ns`` with its 95 % interval
  ``lo_ns``/``hi_ns``, pooled over the run's repetitions as the report
  pools them (``pooled``);
- ``records``: every sample of every run, one row each: the measure's name
  and ``value_ns``, as each probe kind declares (``ProbeKind.records``).

Monitors answer beside runs: each is a row of ``runs`` (``kind`` =
'monitor', one per host) and its probes rows of ``probes``, and three views
read their lines in place (``read_json`` of ``periods.jsonl`` and
``outliers.jsonl``), with the same identity columns:

- ``periods``: one row per host × probe × period: count, p50/p99/p99.9/max,
  ``max_at_utc``, ``gap_s`` (the time not measured before it);
- ``outliers``: one row per outlier above the threshold: ``at_utc``,
  ``value_ns``, ``top_cause`` and ``top_share``, ``complete``, ``kept`` (its
  window was kept) and why not;
- ``outlier_causes``: one row per outlier × cause, its ``ns`` and ``share``.

An outlier's ``at_utc`` is its probe's monotonic time placed by the periods'
own (monotonic, UTC) pairs of their maxima: good to the millisecond the
period lines keep.

Views are made only when a query names them (a view over 200 runs' files
reads their footers), and a file DuckDB finds damaged while answering is
left out, said, and the query asked again of the rest.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from loopscope.dataset.scan import Dataset
from loopscope.errors import InputError
from loopscope.rundir import IDENTITY

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

#: views built on others, and what they read
DERIVED = {"summary": ("comparisons",), "records": ()}
#: views over the monitors' lines (periods.jsonl, outliers.jsonl)
MONITOR_VIEWS = ("periods", "outliers", "outlier_causes")
PERIOD_COLUMNS = {
    "period": "BIGINT",
    "probe": "VARCHAR",
    "host": "VARCHAR",
    "start_utc": "VARCHAR",
    "end_utc": "VARCHAR",
    "seconds": "DOUBLE",
    "count": "BIGINT",
    "gap_s": "DOUBLE",
    "p50_ns": "BIGINT",
    "p99_ns": "BIGINT",
    "p999_ns": "BIGINT",
    "max_ns": "BIGINT",
    "max_t_ns": "BIGINT",
    "max_at_utc": "VARCHAR",
    "samples": "BIGINT",
    "missed": "BIGINT",
    "probe_died": "VARCHAR",
    "interrupted": "VARCHAR",
}
OUTLIER_COLUMNS = {
    "probe": "VARCHAR",
    "host": "VARCHAR",
    "tid": "BIGINT",
    "t_ns": "BIGINT",
    "latency_ns": "BIGINT",
    "window": "VARCHAR",
    "not_kept": "VARCHAR",
    "causes": "STRUCT(cause VARCHAR, ns BIGINT, share DOUBLE)[]",
    "complete": "BOOLEAN",
    "top_cause": "VARCHAR",
}
SUMMARY_METRICS = ("p50", "p99", "p999", "max", "mean")
POOLED_BEFORE = (
    "CASE WHEN metric = 'max' THEN 'largest sample of any repetition' "
    "WHEN metric = 'mean' THEN 'mean of every repetition''s samples together' "
    "ELSE 'quantile of every repetition''s samples together' END"
)


class QueryError(InputError):
    """SQL DuckDB refused: its own message, exit code 2."""


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@dataclass
class Answer:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    notes: list[str] = field(default_factory=list)


def _insert(con: DuckDBPyConnection, table: str, rows: Sequence[tuple[object, ...]], chunk: int = 500) -> None:
    """``rows`` into ``table``, many to a statement: DuckDB's ``executemany``
    runs one statement per row (0.25 s for 1,200 rows; this: 0.06 s)."""
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        one = "(" + ",".join("?" * len(part[0])) + ")"
        con.execute(f"INSERT INTO {table} VALUES " + ",".join([one] * len(part)), [v for r in part for v in r])


class Query:
    """A DuckDB connection that knows a dataset's runs."""

    def __init__(self, ds: Dataset, records: Callable[[], list[tuple[str, str, str]]] | None = None, reuse: bool = False) -> None:
        import duckdb

        self.ds = ds
        #: several questions will be asked (a page): the monitors' outlier lines are read into memory once
        self.reuse = reuse
        #: each kind's records (table, measure, value), asked for only when a question names ``records``
        self._records_of = records or (lambda: [])
        self.con = duckdb.connect(":memory:")
        self.con.execute("SET enable_progress_bar = false")
        self.made: set[str] = set()
        self.notes: list[str] = []
        self._checked: set[Path] = set()
        self._files: dict[str, list[tuple[Path, str]]] = {}
        for r in ds.readable:
            for t, p in r.tables.items():
                if re.fullmatch(r"[a-z_][a-z0-9_]*", t) and t not in (
                    "runs",
                    "probes",
                    *DERIVED,
                    *MONITOR_VIEWS,
                ):  # a table loopscope writes, named as a view can be
                    self._files.setdefault(t, []).append((p, r.run_id))
        self._lines: dict[str, list[tuple[Path, str]]] = {"periods": [], "outliers": []}
        for m in ds.monitors:
            if m.readable:
                for name, f in (("periods", m.periods_file), ("outliers", m.outliers_file)):
                    if f.is_file():
                        self._lines[name].append((f, m.run_id))
        self._base()

    def _base(self) -> None:
        """The tables every view joins: runs (one row per run and host), probes, files."""
        c = self.con
        c.execute(
            "CREATE TABLE runs (run_id VARCHAR, experiment VARCHAR, host VARCHAR, kernel VARCHAR, version VARCHAR, "
            "started_utc TIMESTAMPTZ, path VARCHAR, status VARCHAR, ended_utc TIMESTAMPTZ, format INTEGER, commit VARCHAR, "
            "repetitions INTEGER, first_host VARCHAR, hosts INTEGER, tables INTEGER, kind VARCHAR)"
        )
        c.execute("CREATE TABLE probes (run_id VARCHAR, probe VARCHAR, kind VARCHAR, host VARCHAR)")
        c.execute("CREATE TABLE _files (file VARCHAR, run_id VARCHAR, tbl VARCHAR)")
        runs: list[tuple[object, ...]] = []
        probes: list[tuple[str, str, str | None, str]] = []
        for r in self.ds.readable:
            for h, k in r.hosts.items():
                runs.append(
                    (
                        r.run_id,
                        r.experiment,
                        h,
                        k,
                        r.version,
                        _ts(r.started_utc),
                        str(r.path),
                        r.status,
                        _ts(r.ended_utc),
                        r.format,
                        r.commit,
                        r.repetitions,
                        r.first_host,
                        len(r.hosts),
                        len(r.tables),
                        "run",
                    )
                )
            probes += [(r.run_id, p, k, h) for p, (k, h) in r.probes.items()]
        for m in self.ds.monitors:
            if not m.readable:
                continue
            runs += [
                (
                    m.run_id,
                    m.experiment,
                    h,
                    k,
                    m.version,
                    _ts(m.started_utc),
                    str(m.path),
                    m.status,
                    _ts(m.updated_utc),
                    None,
                    None,
                    None,
                    m.first_host,
                    len(m.hosts),
                    0,
                    "monitor",
                )
                for h, k in m.hosts.items()
            ]
            probes += [(m.run_id, p, k, h) for p, (k, h) in m.probes.items()]
        _insert(c, "runs", runs)
        _insert(c, "probes", probes)
        _insert(c, "_files", [(str(p), rid, t) for t, xs in [*self._files.items(), *self._lines.items()] for p, rid in xs])
        c.execute("CREATE VIEW _run AS SELECT DISTINCT run_id, experiment, version, started_utc, first_host FROM runs")

    @property
    def views(self) -> list[str]:
        """Every name a query can use."""
        return sorted({"runs", "probes", *self._files, *DERIVED, *MONITOR_VIEWS})

    def _columns(self, files: list[tuple[Path, str]]) -> list[str]:
        rel = self.con.sql(f"SELECT * FROM read_parquet([{', '.join(_lit(str(p)) for p, _ in files)}], union_by_name = true) LIMIT 0")
        return list(rel.columns)

    def _table_view(self, name: str) -> None:
        files = self._files.get(name) or []
        if not files:
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM runs WHERE false")  # a name no run has: empty, said by the caller
            return
        cols = self._columns(files)
        drop = [c for c in IDENTITY if c in cols]
        host = "t.host" if "host" in cols else "NULL"
        probe_join = "LEFT JOIN probes p ON p.run_id = f.run_id AND p.probe = t.probe" if "probe" in cols else "LEFT JOIN (SELECT NULL AS host) p ON true"
        src = f"read_parquet([{', '.join(_lit(str(p)) for p, _ in files)}], union_by_name = true, filename = true)"
        self.con.execute(
            f"CREATE VIEW {name} AS WITH x AS ("
            f"SELECT t.* EXCLUDE ({', '.join(['filename', *drop])}), f.run_id AS _run_id, COALESCE({host}, p.host, r.first_host) AS _host "
            f"FROM {src} t JOIN _files f ON f.file = t.filename JOIN _run r ON r.run_id = f.run_id {probe_join}) "
            "SELECT x._run_id AS run_id, r.experiment, x._host AS host, h.kernel, r.version AS loopscope_version, r.started_utc, "
            "x.* EXCLUDE (_run_id, _host) FROM x JOIN _run r ON r.run_id = x._run_id LEFT JOIN runs h ON h.run_id = x._run_id AND h.host = x._host"
        )

    def _summary(self) -> None:
        self.ensure({"comparisons"})
        cols = set(self.con.sql("SELECT * FROM comparisons LIMIT 0").columns)
        if "metric" not in cols:
            self.con.execute(
                "CREATE VIEW summary AS SELECT NULL::VARCHAR AS run_id, NULL::VARCHAR AS host, NULL::VARCHAR AS probe, NULL::VARCHAR AS phase, "
                "NULL::VARCHAR AS measure, NULL::VARCHAR AS kind, NULL::VARCHAR AS metric, NULL::DOUBLE AS value_ns, NULL::DOUBLE AS lo_ns, NULL::DOUBLE AS hi_ns, "
                "NULL::TIMESTAMPTZ AS started_utc, NULL::VARCHAR AS kernel, NULL::BIGINT AS reps, NULL::VARCHAR AS baseline_phase WHERE false"
            )
            return
        pooled = "COALESCE(pooled, " + POOLED_BEFORE + ")" if "pooled" in cols else POOLED_BEFORE
        metrics = ", ".join(_lit(m) for m in SUMMARY_METRICS)
        self.con.execute(
            "CREATE VIEW summary AS SELECT run_id, experiment, host, kernel, loopscope_version, started_utc, probe, kind, measure, phase, loads, "
            f"metric, value_ns, value_lo_ns AS lo_ns, value_hi_ns AS hi_ns, n, reps, {pooled} AS pooled, baseline_phase, ratio, ratio_lo, ratio_hi, significant "
            f"FROM comparisons WHERE metric IN ({metrics})"
        )

    @cached_property
    def records_from(self) -> list[tuple[str, str, str]]:
        """Each kind's records, once a question names ``records`` (the kinds load then)."""
        return list(dict.fromkeys(self._records_of()))

    def _records(self) -> None:
        parts = []
        for table, measure, value in self.records_from:
            if table not in self._files:
                continue
            self.ensure({table})
            cols = set(self.con.sql(f"SELECT * FROM {table} LIMIT 0").columns)
            if value not in cols or "probe" not in cols:
                continue
            t = "t.t_ns" if "t_ns" in cols else "NULL::BIGINT"
            loads = "t.loads" if "loads" in cols else "NULL::VARCHAR"
            parts.append(
                f"SELECT t.run_id, t.experiment, t.host, t.kernel, t.loopscope_version, t.started_utc, t.probe, pr.kind, t.rep, t.phase, {loads} AS loads, "
                f"t._measure AS measure, {t} AS t_ns, t.{value}::DOUBLE AS value_ns FROM (SELECT *, ({measure})::VARCHAR AS _measure FROM {table}) t "
                f"LEFT JOIN probes pr ON pr.run_id = t.run_id AND pr.probe = t.probe WHERE t.{value} IS NOT NULL"
            )
        if not parts:
            parts = [
                "SELECT NULL::VARCHAR AS run_id, NULL::VARCHAR AS host, NULL::VARCHAR AS probe, NULL::VARCHAR AS kind, NULL::VARCHAR AS phase, "
                "NULL::VARCHAR AS measure, NULL::BIGINT AS t_ns, NULL::DOUBLE AS value_ns WHERE false"
            ]
        self.con.execute("CREATE VIEW records AS " + " UNION ALL BY NAME ".join(dict.fromkeys(parts)))

    def _lines_of(self, name: str, columns: dict[str, str]) -> str:
        """The monitors' ``name`` lines as a relation (no file: no row), cut-short lines skipped."""
        files = self._lines[name]
        cols = "{" + ", ".join(f"{_lit(k)}: {_lit(v)}" for k, v in columns.items()) + "}"
        if not files:
            return f"(SELECT {', '.join(f'NULL::{v} AS {k}' for k, v in columns.items())}, NULL::VARCHAR AS filename WHERE false)"
        paths = ", ".join(_lit(str(p)) for p, _ in files)
        return f"read_json([{paths}], format = 'newline_delimited', columns = {cols}, filename = true, ignore_errors = true)"

    def _ident(self, h: str) -> str:
        return f"f.run_id, r.experiment, COALESCE({h}, pr.host, r.first_host) AS host, k.kernel, r.version AS loopscope_version, r.started_utc"

    def _periods_view(self) -> None:
        """periods over the monitors' period lines, read in place by each query that names it."""
        self.con.execute(
            "CREATE OR REPLACE VIEW periods AS SELECT "
            + self._ident("x.host")
            + ", x.probe, x.period, x.start_utc::TIMESTAMPTZ AS start_utc, x.end_utc::TIMESTAMPTZ AS end_utc, x.seconds, x.count, "
            "x.p50_ns, x.p99_ns, x.p999_ns, x.max_ns, x.max_at_utc::TIMESTAMPTZ AS max_at_utc, x.gap_s, x.samples, x.missed, x.probe_died, x.interrupted "
            "FROM " + self._lines_of("periods", PERIOD_COLUMNS) + " x JOIN _files f ON f.file = x.filename JOIN _run r ON r.run_id = f.run_id "
            "LEFT JOIN probes pr ON pr.run_id = f.run_id AND pr.probe = x.probe "
            "LEFT JOIN runs k ON k.run_id = f.run_id AND k.host = COALESCE(x.host, pr.host, r.first_host)"
        )

    def _outlier_views(self) -> None:
        """outliers and outlier_causes over the outlier lines (read once into memory when ``reuse``: a fleet
        page asks several questions of them), each outlier placed on UTC by its probe's periods (only their
        clock pairs are read)."""
        pairs = {k: PERIOD_COLUMNS[k] for k in ("probe", "max_t_ns", "max_at_utc")}
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE _placed AS SELECT f.run_id AS _run_id, x.probe, median(epoch_ns(x.max_at_utc::TIMESTAMPTZ) - x.max_t_ns)::BIGINT AS off_ns "
            "FROM " + self._lines_of("periods", pairs) + " x JOIN _files f ON f.file = x.filename "
            "WHERE x.max_t_ns IS NOT NULL AND x.max_at_utc IS NOT NULL GROUP BY ALL"
        )
        what = "TEMP TABLE" if self.reuse else "VIEW"  # one question: read in place, only what it asks for
        self.con.execute(f"CREATE OR REPLACE {what} _outlier_lines AS SELECT * FROM " + self._lines_of("outliers", OUTLIER_COLUMNS))
        self.con.execute(
            "CREATE OR REPLACE VIEW outliers AS SELECT "
            + self._ident("x.host")
            + ", x.probe, make_timestamptz((x.t_ns + o.off_ns) // 1000) AS at_utc, x.t_ns, x.tid, x.latency_ns AS value_ns, "
            'x.top_cause, x.causes[1].share AS top_share, x.complete, x."window" IS NOT NULL AS kept, x.not_kept, x."window" AS kept_window, x.causes '
            "FROM _outlier_lines x JOIN _files f ON f.file = x.filename JOIN _run r ON r.run_id = f.run_id "
            "LEFT JOIN probes pr ON pr.run_id = f.run_id AND pr.probe = x.probe "
            "LEFT JOIN runs k ON k.run_id = f.run_id AND k.host = COALESCE(x.host, pr.host, r.first_host) "
            "LEFT JOIN _placed o ON o._run_id = f.run_id AND o.probe = x.probe"
        )
        self.con.execute(
            "CREATE OR REPLACE VIEW outlier_causes AS SELECT o.* EXCLUDE (causes, top_cause, top_share, kept_window, not_kept), u.c.cause AS cause, u.c.ns AS ns, u.c.share AS share "
            "FROM outliers o, UNNEST(o.causes) AS u(c)"
        )

    def ensure(self, names: set[str]) -> None:
        """Make the views ``names`` need (once)."""
        for n in sorted(names):
            if n in self.made or n in ("runs", "probes"):
                continue
            if n in ("outliers", "outlier_causes"):
                self.made.update(("outliers", "outlier_causes"))
            self.made.add(n)
            if n == "summary":
                self._summary()
            elif n == "periods":
                self._periods_view()
            elif n in ("outliers", "outlier_causes"):
                self._outlier_views()
            elif n == "records":
                self._records()
            else:
                self._table_view(n)

    def named(self, sql: str) -> set[str]:
        """The views a query names (a word that is a view's name)."""
        words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}
        return words & set(self.views)

    def _reset(self) -> None:
        for n in sorted(self.made):
            self.con.execute(f"DROP VIEW IF EXISTS {n}")
        self.made.clear()

    def run(self, sql: str) -> Answer:
        """The query's answer; QueryError with DuckDB's message for SQL it refuses.
        A run's file DuckDB cannot read is left out, said, and the query asked again."""
        import duckdb

        named: set[str] = set()
        for _ in range(50):
            try:
                named = self.named(sql)
                self.ensure(named)
                rel = self.con.sql(sql)
                if rel is None:
                    return Answer([], [], self.notes)
                return Answer(list(rel.columns), rel.fetchall(), self.notes)
            except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException) as e:
                raise QueryError(_whole(e, self.views)) from None
            except duckdb.Error as e:
                if not self._leave_out_damaged(str(e), named):
                    raise QueryError(f"query: {_first_line(e)}") from None
                self._reset()
        raise QueryError("query: too many damaged files; check the runs with `loopscope runs`")

    def _leave_out_damaged(self, msg: str, named: set[str]) -> bool:
        """Find the files behind ``named`` views that cannot be read whole
        (DuckDB's message does not always name the file), leave them out and
        say so; False when every one reads (the error is the query's)."""
        tables = {t for n in named for t in ([*DERIVED[n]] if n in DERIVED and DERIVED[n] else ([x[0] for x in self.records_from] if n == "records" else [n]))}
        found = False
        for t in sorted(tables):
            for p, rid in list(self._files.get(t) or []):
                if p in self._checked:
                    continue
                try:
                    self.con.execute(f"CREATE OR REPLACE TEMP TABLE _check AS SELECT * FROM read_parquet({_lit(str(p))})")
                    self._checked.add(p)
                except Exception as e:  # noqa: BLE001 - any failure to read the file whole is the file's
                    self._files[t].remove((p, rid))
                    self.con.execute("DELETE FROM _files WHERE file = ?", [str(p)])
                    self.notes.append(f"{p}: left out: it cannot be read ({_first_line(e)})")
                    found = True
        self.con.execute("DROP TABLE IF EXISTS _check")
        return found


def _first_line(e: object) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _whole(e: object, views: list[str]) -> str:
    """DuckDB's whole message for SQL it refuses: its first line (with the
    views, when a name is not one), then the rest as DuckDB wrote it,
    indented: the columns it could have meant (``Candidate bindings``) and
    the query's line with a caret under the place."""
    lines = [x for x in str(e).strip().splitlines() if x.strip()] or [type(e).__name__]
    return "\n".join([f"query: {lines[0]}{_hint(str(e), views)}", *(f"  {x}" for x in lines[1:])])


def _hint(msg: str, views: list[str]) -> str:
    if "Catalog Error" in msg and ("does not exist" in msg or "not found" in msg):
        return f"; the views are: {', '.join(views)} (docs/tables.md)"
    return ""


def _ts(s: str | None) -> _dt.datetime | None:
    if not s:
        return None
    try:
        return _dt.datetime.fromisoformat(s)
    except ValueError:
        return None


def plain(v: object) -> Any:
    """A DuckDB value as JSON holds it (times as ISO text, NaN as null)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)
