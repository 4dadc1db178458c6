"""Starting a monitor: the spec checked and the directory taken (a new one,
or one continued with ``--resume``) before the loop (``run.Monitor``) runs.
Apart from the package so that reading a monitor's files (``page``,
``hist``, the dataset) does not import the lab."""

from __future__ import annotations

from pathlib import Path

from loopscope.errors import InputError
from loopscope.host import procs
from loopscope.kinds import KINDS
from loopscope.lab import cleanup, state
from loopscope.lab.controller import preflight
from loopscope.lab.session import Outcome, Say, execute
from loopscope.rundir import monitor as record
from loopscope.monitor.lock import Lock
from loopscope.monitor.plan import check, own_cpus
from loopscope.monitor.run import Monitor
from loopscope.spec import load


def start(spec_path: str, out: str | None, resume: str | None, for_ns: int | None, say: Say, view: object = None, metrics: str | None = None) -> Outcome:
    """Monitor ``spec_path`` into a new directory ``out`` (or continue ``resume``);
    ``metrics``: HOST:PORT to serve Prometheus metrics on."""
    exp = load(spec_path, KINDS)
    at = None
    if metrics is not None:
        from loopscope.monitor import metrics as M

        at = M.parse_address(metrics)
        M.check_free(*at)
    if exp.monitor is None:
        raise InputError(f"{spec_path}: has no monitor: mapping; add one (monitor: {{period: 1m, threshold: 200us}}) to monitor it")
    check(exp, spec_path)
    if exp.monitor.metrics == "agent" and metrics is None:
        raise InputError(f"{spec_path}: monitor.metrics: agent serves each host's figures on --metrics's port; give --metrics PORT")
    text = Path(spec_path).read_text()
    if resume is not None:
        d = Path(resume)
        if not record.exists(d) or not (d / "spec.yaml").exists():
            raise InputError(f"{d}: not a monitor directory (no monitor.json or spec.yaml); give the directory a monitor wrote")
        if (d / "spec.yaml").read_text() != text:
            raise InputError(
                f"{spec_path}: differs from {d}/spec.yaml, the spec this monitor ran with; resume with that spec (a changed spec is a new monitor)"
            )
    else:
        d = Path(out) if out else Path(exp.results) / f"monitor-{exp.name}"
        if d.exists() and any(d.iterdir()):
            raise InputError(f"{d}: exists and is not empty; give a new directory with -o, or continue it with --resume {d}")
    pinned = own_cpus(exp)
    notes, kinds = preflight(exp, spec_path, d, None)  # before anything is made on disk: a refused monitor leaves nothing
    notes += [pinned] if pinned else []
    d.mkdir(parents=True, exist_ok=True)
    lock = Lock(d)
    lock.take()
    try:
        (d / "spec.yaml").write_text(text)
        if lock.taken_from:
            notes.append(f"continued from pid {lock.taken_from}, which is gone")
            _clean_after(lock.taken_from)
        for n in notes:
            say(f"note: {n}")
        m = Monitor(exp, text, d, say, notes, for_ns, kinds, view=view, metrics=at)  # type: ignore[arg-type]
        return execute(m)
    finally:
        lock.release()


def _clean_after(pid: int) -> None:
    """What a monitor killed outright left registered (its sessions' state,
    and whatever of theirs is still there) is cleaned as ``loopscope
    cleanup`` would, before its successor registers its own."""
    for info in state.registered():
        if info.controller_pid == pid and not procs.alive(info.controller_pid, info.controller_start):
            cleanup.clean_run(info, dry_run=False, reason=f"its monitor (pid {pid}) was killed")
