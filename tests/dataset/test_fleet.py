"""The fleet page (`loopscope fleet DIR`): every monitor under a directory on
one page, from the dataset's views, checked in headless Chromium at 1280 px.
The monitors are copies of a recorded one (tests/recorded.py `monitor`):
analysis, fast tier."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from loopscope.report.fleet import MAX_COLUMNS, _bucket_hours
from tests import recorded
from tests.conftest import Cli
from tests.helpers import assert_clean_error, assert_fits_1280, chromium


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two machines' monitors, each spec naming its host localhost, as a fleet's are gathered."""
    root = tmp_path_factory.mktemp("fleet") / "monitors"
    one = recorded.copy("monitor", root.parent)["watch"]
    root.mkdir()
    shutil.copytree(one, root / "m1")
    shutil.move(str(one), str(root / "m2"))
    return root


def test_the_fleet_page_has_a_row_per_machine_the_causes_ranked_and_the_worst_outliers(fleet: Path, cli: Cli) -> None:
    r = cli("fleet", str(fleet))
    assert r.returncode == 0, r.stderr
    page = (fleet / "fleet.html").read_text()
    assert r.stdout.strip() == str(fleet / "fleet.html")
    # one host name in two monitors is two machines: each row named with its monitor
    rows = re.findall(r'<tr><th title="([^"]+)">', page)
    assert rows == ["m1 · localhost", "m2 · localhost"], rows
    rec = json.loads((fleet / "m1" / "monitor.json").read_text())
    top = max(rec["counts"]["by_top_cause"], key=rec["counts"]["by_top_cause"].get)
    first = re.search(r"<tr><td>([^<]+)</td>", page.split('<h2 id="causes">')[1])
    assert first and first.group(1) == top, (first, top)
    # each cell's tooltip says its maximum and cause; the worst outlier first
    assert re.search(r'title="m1 · localhost: max [0-9.]+ [mµ]s; [^"]+ [0-9]+ %"', page)
    worst = max(json.loads(x)["latency_ns"] for x in (fleet / "m1" / "outliers.jsonl").read_text().splitlines())
    late = re.search(r'<td class="num">([^<]+)</td>', page.split('<h2 id="worst">')[1])
    assert late and late.group(1).replace("\u00a0", " ").startswith(f"{worst / 1e6:.2f} ms"), (late.group(1) if late else None, worst)


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_fleet_page_renders_in_chromium_without_errors_and_fits_1280_px(fleet: Path, cli: Cli) -> None:
    assert cli("fleet", str(fleet), "-o", str(fleet / "f.html")).returncode == 0
    d = chromium(1280, 900, log=True)
    try:
        d.get((fleet / "f.html").as_uri())
        assert d.title.startswith("loopscope fleet")
        assert [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    finally:
        d.quit()
    assert_fits_1280(fleet / "f.html")


def test_a_directory_without_monitors_is_refused_saying_what_to_do(cli: Cli, tmp_path: Path) -> None:
    runs = recorded.copy("dataset", tmp_path)["runs"]
    assert_clean_error(cli("fleet", str(runs)), 2, "holds no readable monitor", "loopscope runs")


def test_the_grid_keeps_to_a_week_of_columns_however_long_the_fleet_ran() -> None:
    assert _bucket_hours(1) == 1 and _bucket_hours(MAX_COLUMNS) == 1
    assert _bucket_hours(MAX_COLUMNS + 1) == 2 and _bucket_hours(24 * 30) * MAX_COLUMNS >= 24 * 30
