"""``loopscope compare`` on recorded runs (tests/recorded.py): a CPU hog on
the probe's CPU is found and trips a criterion (exit 3), the JSON has its documented shape, the page
renders, and runs that cannot be compared are refused (exit 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import recorded
from tests.conftest import BIN, Cli
from tests.helpers import assert_clean_error


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Five repetitions of a timer on CPU 0, quiet and beside a nice -20 hog
    there, recorded (tests/recorded.py): the comparison is analysis, fast tier."""
    return recorded.copy("compare", tmp_path_factory.mktemp("compare"))


def test_a_cpu_hog_on_the_probes_cpu_is_significant_and_trips_the_gate(runs: dict[str, Path], cli: Cli, tmp_path: Path) -> None:
    page = tmp_path / "cmp.html"
    r = cli("compare", str(runs["quiet"]), str(runs["hogged"]), "--fail-if", "p99 > +20%", "--json", "-o", str(page), timeout=300)
    assert r.returncode == 3, r.stderr
    j = json.loads(r.stdout)
    assert [x["label"] for x in j["runs"]] == ["quiet", "hogged"] and j["runs"][0]["baseline"]
    p99 = next(x for x in j["rows"] if x["probe"] == "timer" and x["metric"] == "p99")
    assert set(p99) >= {"run", "probe", "phase", "metric", "baseline", "value", "ratio", "ci95", "significant"}
    assert p99["significant"] and p99["ratio"] > 1.2 and p99["ci95"][0] > 1.2
    mx = next(x for x in j["rows"] if x["metric"] == "max")
    assert mx["ci95"] is None and mx["significant"] is False
    crit = j["criteria"][0]
    assert crit["expr"] == "p99 > +20%" and crit["outcome"] == "fail" and crit["tripped"] and crit["rows"] and crit["probes"] == {"timer": "fail"}
    assert j["outcome"] == "fail" and j["min_effect"] == pytest.approx(0.02)
    assert (
        mx["value"] == max(x["value"] for x in j["rows"] if x["metric"] == "max" and x["phase"] == mx["phase"])
        and mx["pooled"] == "largest sample of any repetition"
    )
    # what differs: the experiment file (the hog phase), shown as a diff
    assert "hogged" in j["differences"]["spec_diff"] and "+  - {name: run, loads: [hog]}" in j["differences"]["spec_diff"]["hogged"]
    html = page.read_text()
    assert "Runs compared" in html and "<svg" in html and "failed" in html and "1 ± <strong>2 %</strong>" in html


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_comparison_page_fits_1280_px_in_chromium_diff_included(runs: dict[str, Path], cli: Cli, tmp_path: Path) -> None:
    from tests.helpers import assert_fits_1280

    page = tmp_path / "cmp.html"
    r = cli("compare", str(runs["quiet"]), str(runs["hogged"]), "-o", str(page), timeout=300)
    assert r.returncode == 0, r.stderr
    assert_fits_1280(page)


def test_a_run_compared_with_itself_has_ratios_of_one_and_holds_the_gate(runs: dict[str, Path], cli: Cli) -> None:
    r = cli("compare", str(runs["quiet"]), str(runs["quiet"]), "--fail-if", "p99 > +20%", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    rows = j["rows"]
    assert rows and all(x["ratio"] is None or abs(x["ratio"] - 1) < 1e-9 for x in rows) and not any(x["significant"] for x in rows)
    # the interval is the repetitions' spread around 1.00x: wholly below the bound (pass) or across it (inconclusive), never past it
    assert j["outcome"] in ("pass", "inconclusive") and j["criteria"][0]["probes"]["timer"] == j["outcome"]


def test_a_bound_inside_the_interval_is_inconclusive_exit_0_or_4_with_strict_and_a_junit_skip_or_failure(
    runs: dict[str, Path], cli: Cli, tmp_path: Path
) -> None:
    from junitparser import Failure, JUnitXml, Skipped

    r = cli("compare", str(runs["quiet"]), str(runs["hogged"]), "--json", timeout=300)
    p99 = next(x for x in json.loads(r.stdout)["rows"] if x["metric"] == "p99")
    assert p99["ci95"][0] < p99["ratio"] < p99["ci95"][1]
    bound = f"p99 > +{(p99['ratio'] - 1) * 100:.1f}%"  # the ratio itself: its interval straddles it
    xml = tmp_path / "gate.xml"
    r = cli("compare", str(runs["quiet"]), str(runs["hogged"]), "--fail-if", bound, "--junit", str(xml), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "inconclusive: " + bound in r.stdout and "straddles the bound" in r.stdout
    case = next(iter(next(iter(JUnitXml.fromfile(str(xml))))))
    assert case.name == f"{bound} · timer" and isinstance(case.result[0], Skipped)
    r = cli(
        "compare", str(runs["quiet"]), str(runs["hogged"]), "--fail-if", bound, "--fail-if", "p99 > +1000000%", "--strict", "--junit", str(xml), timeout=300
    )
    assert r.returncode == 4, r.stderr
    suite = next(iter(JUnitXml.fromfile(str(xml))))
    assert suite.tests == 2 and suite.failures == 1
    got = {c.name: c.result for c in suite}
    assert isinstance(got[f"{bound} · timer"][0], Failure) and got[f"{bound} · timer"][0].type == "inconclusive"
    assert got["p99 > +1000000% · timer"] == []  # passed: the interval wholly below the bound


def test_runs_whose_probes_do_not_match_are_refused(runs: dict[str, Path], cli: Cli, tmp_path: Path, lab: None) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("name: other\nprobes:\n  - {kind: timer, name: tick}\nduration: 300ms\nkernel: {capture: off}\n")
    r = subprocess.run([str(BIN), "run", str(other), "--run-dir", str(tmp_path / "o"), "--no-report"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert_clean_error(cli("compare", str(runs["quiet"]), str(tmp_path / "o")), 2, "probes do not match", "only in quiet: timer", "only in o: tick")


def test_a_bad_criterion_and_a_missing_run_are_input_errors(cli: Cli, tmp_path: Path) -> None:
    assert_clean_error(cli("compare", str(tmp_path), str(tmp_path)), 2, "not a run directory")
