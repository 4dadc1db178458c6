"""Reports: the tables, the comparisons, and the page in a real browser."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from loopscope.kinds import KINDS
from loopscope.report import build
from loopscope.report.sections import ns
from tests import recorded
from tests.conftest import ROOT, Cli
from tests.helpers import assert_clean_error, assert_fits_1280, chromium


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three probes under two loads, the kernel captured: a recorded run
    (tests/recorded.py), so the report is analysis in the fast tier."""
    return recorded.copy("report", tmp_path_factory.mktemp("report"))["run"]


def test_tables_hold_every_sample_tagged_with_its_step(run_dir: Path) -> None:
    build(run_dir, KINDS)
    t = pl.read_parquet(run_dir / "tables" / "timer.parquet")
    assert set(t.columns) >= {"rep", "phase", "loads", "probe", "thread", "t_ns", "latency_ns"}
    assert sorted(t["phase"].unique().to_list()) == ["baseline", "cpu-2", "io-1"]
    assert sorted(t["rep"].unique().to_list()) == [1, 2]
    s = pl.read_parquet(run_dir / "tables" / "sched.parquet")
    assert {"wake_delay_ns", "burst_ns", "extra_ns", "cycle"} <= set(s.columns)
    y = pl.read_parquet(run_dir / "tables" / "syscall.parquet")
    assert sorted(y["call"].unique().to_list()) == ["getpid", "open", "read"]
    assert (y["per_call_ns"] > 0).all()
    loads = pl.read_parquet(run_dir / "tables" / "loads.parquet")
    assert len(loads) == 4 and (loads["cpu_s"] > 0).all()


def test_every_phase_is_compared_with_the_baseline_with_an_interval(run_dir: Path) -> None:
    c = build(run_dir, KINDS).comparisons
    base = c.filter(pl.col("phase") == "baseline")
    assert (base["ratio"] == 1.0).all()
    other = c.filter(pl.col("phase") != "baseline")
    assert len(other) > 0
    with_ci = other.filter(pl.col("ratio_lo").is_not_nan())
    assert (with_ci["ratio_lo"] <= with_ci["ratio"]).all() and (with_ci["ratio"] <= with_ci["ratio_hi"]).all()
    # no interval: the maximum always, p99.9 below 2,000 samples; p50, p99 and the mean always have one
    without = other.filter(pl.col("ratio_lo").is_nan())
    assert set(without["metric"].to_list()) <= {"max", "p999", "missed"}
    assert "max" in set(without["metric"].to_list())
    assert set(c["measure"].unique().to_list()) >= {"latency", "wake_delay", "burst", "getpid", "open", "read"}
    saved = pl.read_parquet(run_dir / "tables" / "comparisons.parquet")
    assert len(saved) == len(c)


def test_the_report_cli_prints_a_summary_and_the_page_path(cli: Cli, run_dir: Path) -> None:
    r = cli("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert "timer latency p99: baseline" in r.stdout
    assert r.stdout.strip().splitlines()[-1].endswith("report.html")
    j = json.loads(cli("report", str(run_dir), "--json").stdout)
    assert j["status"] == "completed" and j["comparisons"]


def test_report_on_something_that_is_not_a_run_is_an_input_error(cli: Cli, tmp_path: Path) -> None:
    assert_clean_error(cli("report", str(tmp_path)), 2, "not a run directory")


def test_the_page_is_self_contained(run_dir: Path) -> None:
    html = build(run_dir, KINDS).html.read_text()
    assert "<script" not in html
    for bad in ('src="http', 'href="http', "@import", "url(http"):
        assert bad not in html
    assert html.count("<svg") >= 6


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_report_renders_in_headless_chromium_without_console_errors(run_dir: Path) -> None:
    from selenium.webdriver.common.by import By

    page = build(run_dir, KINDS).html
    d = chromium(1200, 1600, log=True)
    try:
        d.get(page.as_uri())
        assert d.title == "loopscope · rep"
        assert "Probe timer" in d.find_element(By.ID, "probe-timer").text
        assert len(d.find_elements(By.CSS_SELECTOR, "figure svg")) >= 6
        errors = [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        h = d.execute_script("return document.body.scrollHeight")
        d.set_window_size(1200, min(int(h) + 40, 16000))
        out = ROOT / "test-artifacts"
        out.mkdir(exist_ok=True)
        assert d.save_screenshot(str(out / "report.png"))
    finally:
        d.quit()
    assert (out / "report.png").stat().st_size > 50_000


def test_the_report_reads_each_trace_of_the_run_once(run_dir: Path) -> None:
    steps = json.loads((run_dir / "run.json").read_text())["steps"]
    rep = build(run_dir, KINDS)
    assert rep.traces_read == len({s["trace"] for s in steps})
    assert json.loads((run_dir / "report.json").read_text())["traces_read"] == rep.traces_read


def test_a_fresh_report_parses_the_run_record_spec_and_provenance_once_though_explain_reads_them_too(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = tmp_path / "fresh"
    shutil.copytree(run_dir, fresh, ignore=shutil.ignore_patterns("tables", "report.*", "explain*"))
    read: list[str] = []
    text = Path.read_text

    def counted(self: Path, *a: Any, **k: Any) -> str:
        read.append(self.name)
        return text(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", counted)
    assert build(fresh, KINDS).html.exists()
    assert (fresh / "tables" / "attribution.parquet").exists()  # explain ran, and read the run too
    assert {n: read.count(n) for n in ("run.json", "spec.json", "provenance.json")} == {"run.json": 1, "spec.json": 1, "provenance.json": 1}


def test_a_run_recorded_before_run_formats_still_opens(run_dir: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns("tables", "report.*"))
    run = json.loads((old / "run.json").read_text())
    run.pop("format", None)
    (old / "run.json").write_text(json.dumps(run))
    assert build(old, KINDS).html.exists()


def test_a_run_of_a_newer_format_is_refused_naming_it(run_dir: Path, tmp_path: Path, cli: Cli) -> None:
    new = tmp_path / "new"
    shutil.copytree(run_dir, new, ignore=shutil.ignore_patterns("tables", "report.*"))
    run = json.loads((new / "run.json").read_text())
    (new / "run.json").write_text(json.dumps({**run, "format": 99}))
    r = cli("report", str(new))
    assert_clean_error(r, 2, "run format 99 is newer than this loopscope reads")


def test_the_report_s_table_of_contents_links_to_every_section_in_chromium(run_dir: Path) -> None:
    from selenium.webdriver.common.by import By

    page = build(run_dir, KINDS).html
    d = chromium(1280, 900)
    try:
        d.get(page.as_uri())
        links = d.find_elements(By.CSS_SELECTOR, "nav#toc a")
        targets = [a.get_attribute("href").rsplit("#", 1)[1] for a in links]
        assert {"summary", "probe-timer", "probe-sched", "probe-syscall", "provenance", "files"} <= set(targets), targets
        for t in targets:
            assert d.find_elements(By.ID, t), f"the contents link to #{t}, which the page does not have"
        # every h2 with an id is in the contents
        assert {h.get_attribute("id") for h in d.find_elements(By.CSS_SELECTOR, "h2[id]")} <= set(targets)
        next(a for a in links if a.get_attribute("href").endswith("#provenance")).click()
        assert d.execute_script("return window.scrollY") > 1000
    finally:
        d.quit()


def test_report_writes_the_summary_as_csv_and_markdown(run_dir: Path, cli: Cli, tmp_path: Path) -> None:
    r = cli("report", str(run_dir), "--markdown", "--csv", str(tmp_path / "csv"), timeout=300)
    assert r.returncode == 0, r.stderr
    md = r.stdout
    assert "**timer: wake-up latency**" in md and "| phase | p50 | p99 | p99.9 | max | mean | missed |" in md
    assert "| baseline |" in md and "| cpu-2 |" in md and "×" in md
    s = pl.read_csv(tmp_path / "csv" / "summary.csv")
    assert {"probe", "measure", "phase", "p99_ns", "p99_ratio", "p99_ratio_lo", "p99_significant"} <= set(s.columns)
    assert len(pl.read_csv(tmp_path / "csv" / "comparisons.csv")) == len(pl.read_parquet(run_dir / "tables" / "comparisons.parquet"))


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_at_1280_px_no_element_extends_past_the_right_edge_and_no_chart_text_is_under_11_px(run_dir: Path) -> None:
    assert_fits_1280(build(run_dir, KINDS).html)


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_timer_table_shows_the_tail_and_the_missed_deadlines_in_chromium(run_dir: Path) -> None:
    from selenium.webdriver.common.by import By

    page = build(run_dir, KINDS).html
    comp = pl.read_parquet(run_dir / "tables" / "comparisons.parquet").filter(pl.col("probe") == "timer")
    d = chromium(1280, 900)
    try:
        d.get(page.as_uri())
        table = d.find_element(By.ID, "probe-timer").find_element(By.XPATH, "following-sibling::table[1]")
        heads = [th.text for th in table.find_elements(By.TAG_NAME, "th")]
        assert heads == ["phase", "samples", "p50", "p99", "p99.9", "max", "mean", "missed"], heads
        rows = table.find_elements(By.TAG_NAME, "tr")[1:]
        for row, ph in zip(rows, comp["phase"].unique(maintain_order=True).to_list()):
            cells = row.find_elements(By.TAG_NAME, "td")
            mx = comp.filter((pl.col("phase") == ph) & (pl.col("metric") == "max")).row(0, named=True)
            ms = comp.filter((pl.col("phase") == ph) & (pl.col("metric") == "missed")).row(0, named=True)
            assert cells[5].text.splitlines()[0] == ns(mx["value_ns"])
            assert cells[7].text.startswith(f"{int(ms['value_ns']):,}\nof {int(ms['n']):,}")
    finally:
        d.quit()
    # the maximum is of the samples compared (no interval), at or above p99.9, and never above the table's largest
    tm = pl.read_parquet(run_dir / "tables" / "timer.parquet")
    for (ph,), g in tm.group_by("phase"):
        mx = comp.filter((pl.col("phase") == ph) & (pl.col("metric") == "max")).row(0, named=True)
        p999 = comp.filter((pl.col("phase") == ph) & (pl.col("metric") == "p999")).row(0, named=True)
        assert p999["value_ns"] <= mx["value_ns"] <= g["latency_ns"].max()
        assert mx["value_lo_ns"] is None or mx["value_lo_ns"] != mx["value_lo_ns"]
