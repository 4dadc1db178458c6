"""Assertions shared by the tests."""

from __future__ import annotations

import subprocess


def assert_clean_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """One-line 'loopscope: error: …' on stderr, the exit code, no traceback."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr, r.stderr
    assert err.startswith("loopscope: error: "), err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
