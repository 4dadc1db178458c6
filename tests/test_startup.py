"""What a command loads before it answers: the listings and the agent's
start leave the probe kinds, scipy and matplotlib unloaded (the pattern is
``lazy.py``'s; their import costs 0.25-1 s). Which modules, not how long: the time is
measured, never asserted (docs/benchmarks.md, "Start-up")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
HEAVY = ("loopscope.kinds", "scipy", "matplotlib")


def _loaded_by(code: str) -> set[str]:
    """The top-level names of the modules loaded once ``code`` has run, in a fresh interpreter."""
    probe = f"import sys\ntry:\n{code}\nexcept SystemExit:\n    pass\nimport json\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    return set(json.loads(r.stderr.strip().splitlines()[-1]))


def _heavy(mods: set[str]) -> set[str]:
    return {m for m in mods for h in HEAVY if m == h or m.startswith(h + ".")}


@pytest.mark.parametrize("argv", [["--version"], ["runs", str(FIXTURES)], ["runs", str(FIXTURES), "--format", "json"]])
def test_a_listing_leaves_the_probe_kinds_scipy_and_matplotlib_unloaded(argv: list[str]) -> None:
    mods = _loaded_by(f"    from loopscope.cli import main\n    main({argv!r})")
    assert not _heavy(mods), sorted(_heavy(mods))[:10]


def test_a_query_naming_records_loads_the_kinds_for_their_declarations() -> None:
    q = "SELECT count(*) FROM records"
    mods = _loaded_by(f"    from loopscope.cli import main\n    main(['query', {str(FIXTURES)!r}, {q!r}])")
    assert "loopscope.kinds" in mods


def test_an_agent_starts_without_the_probe_kinds() -> None:
    mods = _loaded_by("    import loopscope.agent.server")
    assert "loopscope.kinds" not in mods


def test_a_report_of_a_run_leaves_scipys_statistics_and_the_lab_unloaded(tmp_path: Path) -> None:
    # its tests are numpy and scipy.special's (0.14 s against scipy.stats' 0.6 s)
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "report" / "run", run)
    mods = _loaded_by(f"    from loopscope.cli import main\n    main(['report', {str(run)!r}])")
    assert (run / "report.html").is_file()
    assert "scipy.stats" not in mods
    # the report's own command module: not the lab, the agents' protocol or the Perfetto export
    assert not {"loopscope.lab.controller", "loopscope.protocol", "loopscope.report.perfetto"} & mods, sorted(m for m in mods if m.startswith("loopscope.lab"))


def test_a_commands_modules_are_left_out_of_the_collectors_passes_once_imported() -> None:
    # what the modules made as they were imported lives as long as the process (gc.freeze): each pass of the
    # cyclic collector, and the one at exit, walks only what the command makes (0.1-0.2 s of a report)
    code = (
        "import gc, click\nfrom loopscope.cli.base import cli\nbefore = gc.get_freeze_count()\n"
        "cli.get_command(click.Context(cli), 'report')\nprint(before, gc.get_freeze_count())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after = map(int, r.stdout.split())
    assert before == 0 and after > 10_000, (before, after)


def test_a_module_loaded_meanwhile_is_there_once_its_thread_is_joined() -> None:
    code = (
        "    import sys\n"
        "    from loopscope import lazy\n"
        "    t = lazy.meanwhile('loopscope.rundir')\n"
        "    t.join()\n"
        "    assert 'loopscope.rundir' in sys.modules and not t.is_alive()\n"
    )
    assert "loopscope.rundir" in _loaded_by(code)


def test_a_module_that_fails_to_load_meanwhile_is_left_to_raise_where_it_is_used() -> None:
    from loopscope import lazy

    t = lazy.meanwhile("loopscope.no_such_module")
    t.join()
    with pytest.raises(ModuleNotFoundError):
        __import__("loopscope.no_such_module")
