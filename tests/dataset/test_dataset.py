"""A directory of recorded runs as one dataset: identity beside every row, read
by DuckDB and polars as it is; `runs`, `query` and `trend` over it; damaged,
older and newer runs among good ones said while the good ones answer."""

from __future__ import annotations

import json
import subprocess
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests import recorded
from tests.conftest import Cli
from tests.helpers import assert_clean_error

IDENTITY = ["run_id", "experiment", "host", "kernel", "loopscope_version", "started_utc"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three real runs of two experiments, one with the kernel capture (its
    attribution), recorded (tests/recorded.py): the dataset is analysis, fast tier."""
    runs = recorded.copy("dataset", tmp_path_factory.mktemp("dataset"))["runs"]
    assert len([p for p in runs.iterdir() if (p / "run.json").exists()]) == 3
    return runs


def _copy(results: Path, to: Path) -> Path:
    out = to / "runs"
    shutil.copytree(results, out)
    return out


def test_every_table_of_a_run_carries_what_identifies_the_run(results: Path) -> None:
    run = sorted(results.iterdir())[0]
    for p in sorted((run / "tables").glob("*.parquet")):
        df = pl.read_parquet(p)
        assert df.columns[-6:] == IDENTITY or set(IDENTITY) <= set(df.columns), p.name
        if len(df):
            assert df["run_id"].unique().to_list() == [run.name], p.name
            assert df["host"].null_count() == 0 and df["kernel"].null_count() == 0, p.name


def test_the_directory_reads_as_one_dataset_in_polars_and_duckdb_as_it_is(results: Path) -> None:
    import duckdb

    lazy = pl.scan_parquet(str(results / "*" / "tables" / "timer.parquet"), missing_columns="insert", extra_columns="ignore")
    by_run = lazy.group_by("run_id", "experiment").agg(pl.col("latency_ns").quantile(0.99)).collect()
    assert sorted(by_run["experiment"].to_list()) == ["tick", "tick", "tock"]
    got = duckdb.sql(f"SELECT run_id, count(*) FROM read_parquet('{results}/*/tables/comparisons.parquet', union_by_name = true) GROUP BY run_id").fetchall()
    assert len(got) == 3 and all(n > 0 for _, n in got)


def test_runs_prints_one_json_line_with_every_run_and_its_p99(results: Path, cli: Cli) -> None:
    r = cli("runs", str(results), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1
    j = json.loads(r.stdout)
    assert list(j) == ["runs", "notes"] and len(j["runs"]) == 3 and j["notes"] == []
    for e in j["runs"]:
        assert e["readable"] and e["status"] == "completed" and e["kernel"] and e["version"] and e["repetitions"] == 2
        f = e["p99"]["timer"]
        assert f["measure"] == "latency" and f["lo_ns"] <= f["value_ns"] <= f["hi_ns"]
    assert [e["started_utc"] for e in j["runs"]] == sorted(e["started_utc"] for e in j["runs"])
    table = cli("runs", str(results))
    assert table.returncode == 0 and all(e["run_id"] in table.stdout for e in j["runs"])
    csv = cli("runs", str(results), "--format", "csv")
    assert csv.returncode == 0 and len(csv.stdout.strip().splitlines()) == 4


def test_query_answers_p99_by_host_from_the_summary_as_the_runs_tables_hold_it(results: Path, cli: Cli) -> None:
    r = cli(
        "query",
        str(results),
        "SELECT run_id, host, value_ns, lo_ns, hi_ns FROM summary WHERE probe = 'timer' AND metric = 'p99' AND phase = 'baseline' ORDER BY run_id",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["columns"] == ["run_id", "host", "value_ns", "lo_ns", "hi_ns"] and len(j["rows"]) == 3
    for run_id, host, v, lo, hi in j["rows"]:
        comp = pl.read_parquet(results / run_id / "tables" / "comparisons.parquet").filter(
            (pl.col("probe") == "timer") & (pl.col("metric") == "p99") & (pl.col("phase") == "baseline")
        )
        assert host == comp["host"][0] and v == comp["value_ns"][0] and lo <= v <= hi


def test_records_hold_every_sample_and_attribution_its_run(results: Path, cli: Cli) -> None:
    r = cli("query", str(results), "SELECT run_id, measure, kind, count(*) FROM records GROUP BY ALL ORDER BY run_id", "--format", "json")
    assert r.returncode == 0, r.stderr
    for run_id, measure, kind, n in json.loads(r.stdout)["rows"]:
        assert (measure, kind) == ("latency", "timer") and n == len(pl.read_parquet(results / run_id / "tables" / "timer.parquet"))
    r = cli("query", str(results), "SELECT DISTINCT experiment FROM attribution", "--format", "csv")
    assert r.returncode == 0 and r.stdout.split() == ["experiment", "tock"]


def _duckdb_error(r: subprocess.CompletedProcess[str], *needles: str) -> list[str]:
    """loopscope's error line first, then DuckDB's own lines (exit 2, no traceback)."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.rstrip().splitlines()
    assert lines[0].startswith("loopscope: error: query: ") and all(x.startswith("  ") for x in lines[1:]), lines
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    return lines


def test_bad_sql_is_duckdbs_own_message_and_exit_2(results: Path, cli: Cli) -> None:
    lines = _duckdb_error(cli("query", str(results), "SELEC 1"), "Parser Error", "syntax error", "LINE 1: SELEC 1")
    # the caret stands under the word DuckDB refused
    at = lines[-2].index("SELEC 1")
    assert lines[-1].index("^") == at, lines
    _duckdb_error(cli("query", str(results), "SELECT * FROM nothere"), "nothere", "the views are:", "summary")
    # a wrong column keeps DuckDB's own hint: the columns it could have meant
    _duckdb_error(cli("query", str(results), "SELECT p99_nss FROM summary"), "Binder Error", "Candidate bindings", "value_ns")


def test_a_directory_without_runs_is_said(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert_clean_error(cli("runs", str(tmp_path / "empty")), 2, "holds no run")
    assert_clean_error(cli("query", str(tmp_path / "nope"), "SELECT 1"), 2, "not a directory")


def test_damaged_runs_are_said_and_the_good_ones_still_answer(results: Path, cli: Cli, tmp_path: Path) -> None:
    runs = _copy(results, tmp_path)
    a, b, c = sorted(runs.iterdir())
    (a / "run.json").write_text("{ not json")
    cut = b / "tables" / "timer.parquet"
    cut.write_bytes(cut.read_bytes()[:200])
    comp = c / "tables" / "comparisons.parquet"
    raw = bytearray(comp.read_bytes())
    raw[100 : len(raw) // 2] = b"\x55" * (len(raw) // 2 - 100)  # magic intact, pages not: only a full read finds it
    comp.write_bytes(bytes(raw))
    r = cli("runs", str(runs), "--format", "json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    bad = next(e for e in j["runs"] if e["run_id"] == a.name)
    assert not bad["readable"] and "cannot be read" in bad["why"]
    assert any(str(cut) in n and "cut short" in n for n in j["notes"])
    r = cli("query", str(runs), "SELECT run_id, count(*) FROM summary GROUP BY ALL")
    assert r.returncode == 0, r.stderr
    assert b.name in r.stdout and c.name not in r.stdout
    assert f"{comp}: left out" in r.stderr and f"{a}: left out" in r.stderr
    r = cli("query", str(runs), "SELECT count(DISTINCT run_id) FROM timer", "--format", "csv")
    assert r.returncode == 0 and r.stdout.split()[-1] == "1"  # c's timer table; b's was cut short, a cannot be read


def test_runs_of_other_formats_are_read_by_theirs_or_listed_with_why(results: Path, cli: Cli, tmp_path: Path) -> None:
    runs = _copy(results, tmp_path)
    old, new, _ = sorted(runs.iterdir())
    # a run from before tables carried their run's identity, with a run record of format 1
    for p in (old / "tables").glob("*.parquet"):
        pl.read_parquet(p).drop([c for c in IDENTITY if c != "host" or p.stem not in ("loads", "attribution")], strict=False).write_parquet(p)
    rec = json.loads((old / "run.json").read_text())
    rec.pop("format")
    (old / "run.json").write_text(json.dumps(rec))
    rec = json.loads((new / "run.json").read_text())
    rec["format"] = 99
    (new / "run.json").write_text(json.dumps(rec))
    r = cli("query", str(runs), "SELECT run_id, host, kernel, loopscope_version, count(*) AS n FROM timer GROUP BY ALL ORDER BY run_id", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [x[0] for x in rows] == sorted(p.name for p in runs.iterdir() if p != new)
    assert all(x[1] == "localhost" and x[2] and x[3] for x in rows)
    assert "run format 99 is newer than this loopscope reads" in " ".join(json.loads(r.stdout)["notes"])


def test_trend_gives_each_runs_value_with_its_interval_and_a_page_that_fits_1280_px(results: Path, cli: Cli, tmp_path: Path) -> None:
    page = tmp_path / "trend.html"
    r = cli("trend", str(results), "--probe", "timer", "--metric", "p99", "--by", "kernel", "-o", str(page), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["measure"] == "latency" and len(j["points"]) == 3 and j["missing"] == []
    assert all(p["lo_ns"] <= p["value_ns"] <= p["hi_ns"] and p["series"] == p["kernel"] for p in j["points"])
    assert [p["started_utc"] for p in j["points"]] == sorted(p["started_utc"] for p in j["points"])
    html = page.read_text()
    assert "<svg" in html and all(p["run_id"] in html for p in j["points"])
    table = cli("trend", str(results), "--probe", "timer", "--phase", "cpu")
    assert table.returncode == 0 and "cpu" in table.stdout
    assert_clean_error(cli("trend", str(results), "--probe", "nope"), 2, "no run of the dataset has a probe named 'nope'", "timer")


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_trend_page_fits_1280_px_in_chromium(results: Path, cli: Cli, tmp_path: Path) -> None:
    from tests.helpers import assert_fits_1280

    page = tmp_path / "trend.html"
    assert cli("trend", str(results), "--probe", "timer", "--by", "host", "-o", str(page)).returncode == 0
    assert_fits_1280(page)
