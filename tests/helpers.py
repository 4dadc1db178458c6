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


def wait_gone(pid: int, timeout: float) -> bool:
    """True once process ``pid`` no longer exists (zombies count as gone)."""
    import time
    from pathlib import Path

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


def chromium(width: int = 1280, height: int = 900, log: bool = False):  # type: ignore[no-untyped-def]
    """A headless Chromium driven by selenium (quit it when done), as the report tests open pages."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    o = Options()
    o.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", f"--window-size={width},{height}"):
        o.add_argument(a)
    if log:
        o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=o)
