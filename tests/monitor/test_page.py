"""The monitor's page, from a recorded monitor (tests/recorded.py `monitor`):
rendered through the report's template, each period drawn as long as it
lasted, and in a real browser without errors; and where the monitor puts a
probe that names no CPU, so that it does not measure itself. Fast tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopscope.spec import Experiment

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


def _exp(probes: str) -> Experiment:
    from loopscope.kinds import KINDS
    from loopscope.spec import parse

    return parse(f"name: m\nprobes:\n{probes}monitor: {{period: 3s, threshold: 1ms}}\n", "m.yaml", KINDS)


def test_a_probe_without_a_cpu_is_pinned_off_the_monitors_own_threads() -> None:
    from loopscope.monitor.plan import own_cpus

    exp = _exp("  - {kind: timer, name: t}\n")
    note = own_cpus(exp, usable=[0, 1])
    assert exp.probes[0].cpu == [1] and note and "pins it to CPU 1" in note and "own threads on CPU 0" in note


def test_a_pinned_probe_is_left_as_it_is_and_nothing_is_said() -> None:
    from loopscope.monitor.plan import own_cpus

    exp = _exp("  - {kind: timer, name: t, cpu: [0]}\n")
    assert own_cpus(exp, usable=[0, 1]) is None and exp.probes[0].cpu == [0]


def test_with_one_cpu_the_monitor_says_it_shares_the_probes_cpu() -> None:
    from loopscope.monitor.plan import own_cpus

    exp = _exp("  - {kind: timer, name: t}\n")
    note = own_cpus(exp, usable=[0])
    assert not exp.probes[0].cpu and note and "lab: agent" in note and "share" in note


def test_probes_pinned_to_every_cpu_are_said_to_share_them_with_the_monitors_own_threads() -> None:
    from loopscope.monitor.plan import own_cpus

    exp = _exp("  - {kind: timer, name: a, cpu: [0]}\n  - {kind: timer, name: b, cpu: [1]}\n")
    note = own_cpus(exp, usable=[0, 1])
    assert note and "pinned to every CPU it may use (0, 1)" in note and "lab: agent" in note and exp.probes[0].cpu == [0]
