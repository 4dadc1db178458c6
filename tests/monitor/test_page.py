"""The monitor's page, from a recorded monitor (tests/recorded.py `monitor`):
rendered through the report's template, each period drawn as long as it
lasted, and in a real browser without errors. Analysis, fast tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import recorded
from tests.conftest import Cli
from tests.helpers import assert_fits_1280, chromium


@pytest.fixture
def watch(tmp_path: Path) -> Path:
    return recorded.copy("monitor", tmp_path)["watch"]


def test_the_page_holds_each_probes_charts_the_causes_and_the_counts_of_the_record(watch: Path, cli: Cli) -> None:
    r = cli("report", str(watch))
    assert r.returncode == 0, r.stderr
    page = (watch / "report.html").read_text()
    rec = json.loads((watch / "monitor.json").read_text())
    assert page.count("<svg") == 3 * len(rec["probes"])
    assert (
        "Causes of the kept outliers" in page
        and rec["counts"]["by_top_cause"]
        and max(rec["counts"]["by_top_cause"], key=rec["counts"]["by_top_cause"].get) in page
    )
    assert f'<td class="num">{rec["counts"]["outliers_above"]:,}</td>' in page
    # the periods on a time axis (an interrupted period is as narrow as it was), the time between them blank
    assert "since the first period began" in page and "blank: not measured, between periods" in page
    # a wake-up past the next one is said as what it is, not as a deadline the spec never set
    assert "missed deadlines" not in page


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_page_renders_in_headless_chromium_without_errors_and_fits_1280_px(watch: Path, cli: Cli) -> None:
    assert cli("report", str(watch)).returncode == 0
    page = watch / "report.html"
    d = chromium(1280, 900, log=True)
    try:
        d.get(page.as_uri())
        assert d.title == "loopscope monitor: watch"
        assert [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    finally:
        d.quit()
    assert_fits_1280(page)
