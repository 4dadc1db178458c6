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
    """A headless Chromium driven by selenium (quit it when done), as the report tests open pages.

    Its profile and the temporary directories it makes for itself (its singleton socket, which a quit
    by chromedriver leaves behind) are in one directory of ours, removed by ``quit``."""
    import os
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    o = Options()
    o.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={width},{height}",
    ):
        o.add_argument(a)
    if log:
        o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    scratch = tempfile.mkdtemp(prefix="ls-chromium-")
    o.add_argument(f"--user-data-dir={scratch}/profile")
    try:
        d = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver", env={**os.environ, "TMPDIR": scratch}), options=o)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    quit_ = d.quit

    def quit() -> None:
        try:
            quit_()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    d.quit = quit  # type: ignore[method-assign]
    return d


LAYOUT_JS = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
const W = document.documentElement.clientWidth;
const wide = [];
for (const el of document.querySelectorAll('body *')) {
  const r = el.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  if (r.right > W + 0.5) {
    const cls = typeof el.className === 'string' ? el.className : '';
    wide.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}${cls ? '.' + cls : ''} ends at ${Math.round(r.right)} px: ${(el.textContent || '').trim().slice(0, 50)}`);
  }
}
const small = [];
for (const svg of document.querySelectorAll('svg')) {
  const vb = svg.viewBox && svg.viewBox.baseVal;
  const k = vb && vb.width ? svg.getBoundingClientRect().width / vb.width : 1;
  for (const t of svg.querySelectorAll('text')) {
    const px = parseFloat(getComputedStyle(t).fontSize) * k;
    if (px < 11) small.push(`${px.toFixed(1)} px: ${t.textContent.slice(0, 40)}`);
  }
}
return {wide: wide, small: small, page_width: document.documentElement.scrollWidth, viewport: W};
"""


def layout_problems(driver) -> dict:  # type: ignore[no-untyped-def]
    """With every <details> opened: the elements whose box extends past the
    viewport's right edge (hidden ones included: they are opened first) and
    the chart texts drawn smaller than 11 px on screen (the old legends were 9.1 px)."""
    return driver.execute_script(LAYOUT_JS)


def assert_fits_1280(page) -> None:  # type: ignore[no-untyped-def]
    """Open ``page`` (a Path) in Chromium at 1280 px: nothing past the right
    edge, no chart text under 11 px (``layout_problems``)."""
    d = chromium(1280, 900)
    try:
        d.get(page.as_uri())
        got = layout_problems(d)
    finally:
        d.quit()
    assert got["wide"] == [] and got["page_width"] <= got["viewport"], got["wide"][:10]
    assert got["small"] == [], got["small"][:10]
