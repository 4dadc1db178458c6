"""Tunings against a stand-in sysfs tree: what the test machine lacks (a VM
without a cpuidle driver, an IRQ that is not there) is built here, and said."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopscope.errors import InputError
from loopscope.host import tunings


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in /sys and /proc: two CPUs with idle states POLL, C1, C6, and IRQ 24."""
    for c in (0, 1):
        for i, name in enumerate(("POLL", "C1", "C6")):
            d = tmp_path / f"sys/devices/system/cpu/cpu{c}/cpuidle/state{i}"
            d.mkdir(parents=True)
            (d / "name").write_text(name + "\n")
            (d / "disable").write_text("0\n")
    (tmp_path / "proc/irq/24").mkdir(parents=True)
    (tmp_path / "proc/irq/24/smp_affinity_list").write_text("0-1\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/timer_migration").write_text("1\n")
    monkeypatch.setenv("LOOPSCOPE_SYSFS_ROOT", str(tmp_path))
    return tmp_path


def test_a_phase_s_tunings_are_applied_and_every_old_value_comes_back(sysfs: Path, tmp_path: Path) -> None:
    a = tunings.Applied(tmp_path / "run.tunings")
    a.apply(
        [
            {"kind": "cpuidle", "state": "C6", "cpus": [0, 1], "disable": True},
            {"kind": "irq", "irq": 24, "cpus": [1]},
            {"kind": "write", "path": "/proc/sys/kernel/timer_migration", "value": 0},
        ],
        "phases.1",
    )
    assert (sysfs / "sys/devices/system/cpu/cpu1/cpuidle/state2/disable").read_text().strip() == "1"
    assert (sysfs / "proc/irq/24/smp_affinity_list").read_text().strip() == "1"
    rec = a.record()
    assert {"path": "/proc/irq/24/smp_affinity_list", "old": "0-1", "new": "1"}.items() <= rec[2].items()
    assert a.restore() == []
    assert (sysfs / "sys/devices/system/cpu/cpu1/cpuidle/state2/disable").read_text().strip() == "0"
    assert (sysfs / "proc/irq/24/smp_affinity_list").read_text().strip() == "0-1"
    assert (sysfs / "proc/sys/kernel/timer_migration").read_text().strip() == "1"
    assert not (tmp_path / "run.tunings").exists()


def test_a_journal_a_dead_run_left_restores_the_old_values(sysfs: Path, tmp_path: Path) -> None:
    journal = tmp_path / "dead.tunings"
    a = tunings.Applied(journal)
    a.apply([{"kind": "irq", "irq": 24, "cpus": [0]}], "phases.0")
    del a  # the controller was killed: nothing restored
    assert (sysfs / "proc/irq/24/smp_affinity_list").read_text().strip() == "0"
    lines = tunings.restore_journal(journal)
    assert lines == ["  restored /proc/irq/24/smp_affinity_list to '0-1'"]
    assert (sysfs / "proc/irq/24/smp_affinity_list").read_text().strip() == "0-1" and not journal.exists()


@pytest.mark.parametrize(
    "tuning, needle",
    [
        ({"kind": "irq", "irq": 99, "cpus": [0]}, "/proc/irq/99/smp_affinity_list does not exist"),
        ({"kind": "cpuidle", "state": "C9"}, "has no idle state 'C9'; its states are 0 (POLL), 1 (C1), 2 (C6)"),
        ({"kind": "write", "path": "/etc/passwd", "value": "x"}, "not on the list of files a tuning may write"),
    ],
)
def test_a_tuning_that_cannot_apply_is_refused_naming_it(sysfs: Path, tuning: dict, needle: str) -> None:
    problems = tunings.check([{"tunings": [tuning]}])
    assert len(problems) == 1 and problems[0].startswith("phases.0.tunings.0") and needle in problems[0], problems


def test_a_machine_without_a_cpuidle_driver_is_told_there_are_no_idle_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stand-in of a VM whose CPUs have no cpuidle directory
    (tmp_path / "sys/devices/system/cpu/cpu0").mkdir(parents=True)
    monkeypatch.setenv("LOOPSCOPE_SYSFS_ROOT", str(tmp_path))
    with pytest.raises(InputError, match="CPU 0 has no idle states to disable"):
        tunings.changes({"kind": "cpuidle", "state": 1, "cpus": [0]}, "phases.0.tunings.0")
