"""Monitors in the dataset: `runs` lists a monitor as such, `query` reads its
periods and outliers in place with the identity every view carries, and
`trend` follows a monitored probe period by period. The monitor is a real
one, recorded (tests/recorded.py `monitor`): analysis, fast tier."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from tests import recorded
from tests.conftest import Cli

IDENTITY = ["run_id", "experiment", "host", "kernel", "loopscope_version", "started_utc"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory holding the recorded monitor beside the recorded runs."""
    root = tmp_path_factory.mktemp("fleet")
    runs = recorded.copy("dataset", root)["runs"]
    mon = recorded.copy("monitor", root)["watch"]
    shutil.move(str(mon), str(runs / "watch"))
    return runs


def _lines(p: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _query(cli: Cli, root: Path, sql: str) -> list[dict[str, object]]:
    r = cli("query", str(root), sql, "--format", "json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    return [dict(zip(j["columns"], row)) for row in j["rows"]]


def test_runs_lists_a_monitor_as_a_monitor_beside_the_runs(fleet: Path, cli: Cli) -> None:
    r = cli("runs", str(fleet), "--format", "json")
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)["runs"]
    assert sorted(e["kind"] for e in entries) == ["monitor", "run", "run", "run"]
    (m,) = [e for e in entries if e["kind"] == "monitor"]
    rec = json.loads((fleet / "watch" / "monitor.json").read_text())
    assert m["run_id"] == "watch" and m["experiment"] == "watch" and m["periods"] == rec["periods"] > 0
    assert m["outliers_above"] == rec["counts"]["outliers_above"] and m["kept"] == rec["counts"]["kept"]
    assert list(m["hosts"]) == ["localhost"] and m["kernel"] and m["probes"] == {"t": {"kind": "timer", "host": "localhost"}}
    assert m["lost_hosts"] == [] and all(e["lost_hosts"] == [] for e in entries)
    assert not any("monitor" in n for n in json.loads(r.stdout)["notes"])  # listed, not left out
    human = cli("runs", str(fleet))
    assert human.returncode == 0 and "1 monitors in" in human.stdout and "3 runs in" in human.stdout, human.stdout


def test_runs_takes_a_monitors_own_directory(fleet: Path, cli: Cli) -> None:
    r = cli("runs", str(fleet / "watch"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [e["kind"] for e in json.loads(r.stdout)["runs"]] == ["monitor"]


def test_periods_hold_one_row_per_probe_and_period_with_the_monitors_identity(fleet: Path, cli: Cli) -> None:
    rows = _query(cli, fleet, "SELECT * FROM periods ORDER BY period")
    lines = [x for x in _lines(fleet / "watch" / "periods.jsonl") if x.get("probe")]
    assert [r["period"] for r in rows] == [x["period"] for x in lines]
    assert list(rows[0])[:6] == IDENTITY and {r["run_id"] for r in rows} == {"watch"} and {r["host"] for r in rows} == {"localhost"}
    for r, x in zip(rows, lines):
        assert (r["count"], r["max_ns"], r["p99_ns"]) == (x["count"], x.get("max_ns"), x.get("p99_ns"))
        assert r["max_at_utc"] and r["start_utc"] <= r["max_at_utc"] <= r["end_utc"]


def test_outliers_and_their_causes_are_the_monitors_lines_placed_in_utc(fleet: Path, cli: Cli) -> None:
    lines = _lines(fleet / "watch" / "outliers.jsonl")
    assert lines, "the recorded monitor kept no outlier: re-record it (python -m tests.recorded monitor)"
    rows = _query(cli, fleet, "SELECT * FROM outliers ORDER BY t_ns")
    assert len(rows) == len(lines) and list(rows[0])[:6] == IDENTITY
    rec = json.loads((fleet / "watch" / "monitor.json").read_text())
    start, end = (dt.datetime.fromisoformat(rec[k]) for k in ("started_utc", "updated_utc"))
    for r, x in zip(rows, sorted(lines, key=lambda x: x["t_ns"])):
        assert r["value_ns"] == x["latency_ns"] and r["top_cause"] == x.get("top_cause") and r["kept"] == (x["window"] is not None)
        # placed by the periods' own clock pairs: inside the monitor's span, to the millisecond
        assert start - dt.timedelta(seconds=1) <= dt.datetime.fromisoformat(r["at_utc"]) <= end + dt.timedelta(seconds=1), (r["at_utc"], start, end)
    causes = _query(cli, fleet, "SELECT t_ns, sum(share) AS s, count(*) AS n FROM outlier_causes GROUP BY t_ns")
    assert len(causes) == len([x for x in lines if x.get("causes")])
    assert all(0.99 <= c["s"] <= 1.01 for c in causes), causes
    top = _query(cli, fleet, "SELECT host, date_trunc('hour', at_utc) AS hour, top_cause, count(*) AS n FROM outliers GROUP BY ALL ORDER BY n DESC")
    assert top and top[0]["host"] == "localhost" and top[0]["top_cause"]


def test_runs_and_monitors_answer_one_query_and_a_run_is_no_monitor(fleet: Path, cli: Cli) -> None:
    rows = _query(cli, fleet, "SELECT kind, count(DISTINCT run_id) AS n FROM runs GROUP BY kind ORDER BY kind")
    assert rows == [{"kind": "monitor", "n": 1}, {"kind": "run", "n": 3}]
    assert _query(cli, fleet, "SELECT count(*) AS n FROM timer WHERE run_id = 'watch'") == [{"n": 0}]


def test_trend_follows_a_monitored_probe_period_by_period(fleet: Path, cli: Cli) -> None:
    r = cli("trend", str(fleet / "watch"), "--probe", "t", "--metric", "max", "--by", "host", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    maxima = [x["max_ns"] for x in _lines(fleet / "watch" / "periods.jsonl") if x.get("probe") == "t" and x.get("max_ns") is not None]
    assert [p["value_ns"] for p in j["points"]] == maxima and {p["series"] for p in j["points"]} == {"localhost"}
    assert all(p["phase"].startswith("period ") and p["lo_ns"] is None for p in j["points"])


def test_a_damaged_monitor_record_is_listed_with_why_and_the_runs_still_answer(fleet: Path, cli: Cli, tmp_path: Path) -> None:
    root = Path(shutil.copytree(fleet, tmp_path / "copy"))
    (root / "watch" / "monitor.json").write_text('{"name": "watch", "sta')
    r = cli("runs", str(root), "--format", "json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    (m,) = [e for e in j["runs"] if e["kind"] == "monitor"]
    assert not m["readable"] and "cannot be read" in m["why"]
    assert any("watch" in n and "left out" in n for n in j["notes"]), j["notes"]
    assert len(_query(cli, root, "SELECT DISTINCT run_id FROM timer")) == 3
    # JSON that parses but is no monitor's record is said the same way, not a traceback
    (root / "watch" / "monitor.json").write_text("[1, 2]")
    r = cli("runs", str(root), "--format", "json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (m,) = [e for e in json.loads(r.stdout)["runs"] if e["kind"] == "monitor"]
    assert not m["readable"] and "not a monitor's record" in m["why"], m
