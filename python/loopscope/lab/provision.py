"""``loopscope hosts install``: this controller's exact loopscope on every ssh and exec host.

A fleet's machines should not need loopscope installed by hand, nor reach
a package index. The controller gathers what it runs with:

- the loopscope wheel built from this source tree (``maturin build
  --release``, seconds: the Rust is already compiled), identified by the
  contents of its files (maturin's zips differ in timestamps from one build
  to the next, never in content);
- the wheels of its locked dependencies (``requirements.lock``: the exact
  versions and hashes ``make`` installs), fetched here once with ``pip
  download --require-hashes`` and kept in ``~/.cache/loopscope/``;
- PyPA's ``installer`` wheel, which installs the others on the host;

and streams them, as one uncompressed tar (wheels are compressed already),
through the host's own channel: the launcher's or ssh's standard input.
On the host a short bootstrap (Python's standard library only, run by the
host's ``system_python``) unpacks them, refuses when the host's Python or
machine does not match the wheels (naming both), creates a venv without pip
in ``install_dir/<version>.partial``, installs every wheel with
``installer``, writes what it installed, and renames the directory to
``install_dir/<version>``: a half-done install is never taken for one. The
host reaches no index; pip never runs there.

A host whose ``install_dir/<version>`` already holds the same build (same
files, same locked dependencies) is left alone; ``--force`` reinstalls.
Hosts are installed side by side.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

from typing_extensions import TypedDict

from loopscope.errors import InputError, RunError
from loopscope.lab import launch
import loopscope
import io
import asyncio

if TYPE_CHECKING:
    from loopscope.spec.models import Host

Say = Callable[[str], None]

#: the first word of the bootstrap's last line
DONE, REFUSED, ALREADY = "loopscope-installed", "loopscope-install-refused", "loopscope-install-current"

# Runs on the host with its own Python: standard library only. argv: install_dir.
BOOTSTRAP = (
    r"""
import json, os, platform, shutil, subprocess, sys, tarfile, venv
d = os.path.expanduser(sys.argv[1])
os.makedirs(d, exist_ok=True)
work = os.path.join(d, ".incoming-%d" % os.getpid())
os.makedirs(work)
try:
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(work, filter="data")
        else:
            t.extractall(work)
    m = json.load(open(os.path.join(work, "manifest.json")))
    mine = "%d.%d" % sys.version_info[:2]
    if mine != m["python"] or platform.machine() != m["machine"]:
        print("%s this host's %s is Python %s on %s, and this controller's wheels are for Python %s on %s: set system_python to a Python %s there"
              % ("@REFUSED@", sys.executable, mine, platform.machine(), m["python"], m["machine"], m["python"]))
        sys.exit(3)
    target = os.path.join(d, m["version"])
    try:
        if json.load(open(os.path.join(target, "loopscope-install.json"))).get("identity") == m["identity"] and not m.get("force"):
            print("@ALREADY@", m["version"], os.path.join(target, "bin", "python"))
            sys.exit(0)
    except (OSError, ValueError):
        pass
    tmp = target + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    venv.create(tmp, with_pip=False, symlinks=True)
    wheels = sorted(os.path.join(work, "wheels", w) for w in os.listdir(os.path.join(work, "wheels")))
    code = ("import sys, sysconfig\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from installer import install\n"
            "from installer.destinations import SchemeDictionaryDestination\n"
            "from installer.sources import WheelFile\n"
            "dest = SchemeDictionaryDestination(sysconfig.get_paths(), interpreter=sys.executable, script_kind='posix')\n"
            "for w in sys.argv[2:]:\n"
            "    with WheelFile.open(w) as src:\n"
            "        install(src, dest, {'INSTALLER': b'loopscope hosts install'})\n")
    r = subprocess.run([os.path.join(tmp, "bin", "python"), "-c", code, os.path.join(work, m["installer"])] + wheels)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(r.returncode)
    with open(os.path.join(tmp, "loopscope-install.json"), "w") as f:
        json.dump({k: m[k] for k in ("version", "identity", "python", "machine")}, f)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(tmp, target)
    print("@DONE@", m["version"], os.path.join(target, "bin", "python"))
finally:
    shutil.rmtree(work, ignore_errors=True)
""".replace("@REFUSED@", REFUSED)
    .replace("@ALREADY@", ALREADY)
    .replace("@DONE@", DONE)
)


class ProvisionError(RunError):
    """Gathering what to install failed (building the wheel, fetching the locked dependencies)."""


@dataclass
class Bundle:
    """What goes to every host: the tar to stream and what it holds."""

    tar: Path
    version: str
    identity: str
    wheels: int
    bytes: int
    files: list[Path]
    manifest: dict[str, object]


def source_tree() -> Path | None:
    """The source tree this loopscope was built from (an editable install's), if there is one."""

    root = Path(loopscope.__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() and (root / "requirements.lock").exists() else None


def _identity(wheel: Path) -> str:
    """A build's identity: its files' names and contents (CRCs), not the zip's timestamps
    nor maturin's SBOM (and the RECORD that lists its hash), which change with every build."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if "/sboms/" not in info.filename and not info.filename.endswith(".dist-info/RECORD"):  # a build's SBOM carries its time
                h.update(f"{info.filename}\0{info.CRC:08x}\0{info.file_size}\n".encode())
    return h.hexdigest()[:16]


def build_env() -> dict[str, str]:
    """The Rust build's environment as the Makefile sets it: zstd from the
    system's libzstd when pkg-config finds it. Built otherwise, zstd-sys
    would see its setting change, compile its bundled copy (a minute here),
    and the next ``make`` would build it again the other way."""
    env = dict(os.environ)
    if shutil.which("pkg-config") and subprocess.run(["pkg-config", "--exists", "libzstd"], capture_output=True).returncode == 0:
        env["ZSTD_SYS_USE_PKG_CONFIG"] = "1"
    return env


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loopscope" / "hosts"


@contextmanager
def _alone(say: Say) -> Iterator[None]:
    """One ``hosts install`` at a time on this machine's cache: two at once
    removed each other's wheel from ``build/`` between its build and its
    use (and wrote one ``bundle.tar``). The second waits, saying so."""
    cache = _cache()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another hosts install to finish (it holds {cache / '.lock'}) …")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def bundle(say: Say, wheel: str | None = None, force: bool = False) -> Bundle:
    """The tar every host receives (built under ``~/.cache/loopscope/``)."""
    src = source_tree()
    if src is None:
        raise InputError(
            "hosts install builds the wheel from loopscope's source tree, and this loopscope was not installed from one: run it from a clone (make install)"
        )
    cache = _cache()
    lock = src / "requirements.lock"
    lock_id = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    deps = cache / f"deps-{lock_id}"
    if not (deps / ".complete").exists():
        say(f"fetching the locked dependencies' wheels (requirements.lock) into {deps} …")
        shutil.rmtree(deps, ignore_errors=True)
        deps.mkdir(parents=True)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "-r",
                str(lock),
                "-d",
                str(deps),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if r.returncode != 0:
            raise ProvisionError(f"pip download of requirements.lock failed: {r.stderr.strip()[-800:]}")
        (deps / ".complete").write_text(lock_id)
    built = cache / "build"
    shutil.rmtree(built, ignore_errors=True)
    if wheel is None:
        maturin = src / "target" / "tools" / "bin" / "maturin"
        exe = str(maturin) if maturin.exists() else shutil.which("maturin")
        if exe is None:
            raise ProvisionError(f"maturin is not installed ({maturin} is missing): make install builds it")
        say("building the loopscope wheel (maturin build --release) …")
        # (linked to the system's libzstd.so.1, which every host with a Linux
        # package manager has: the wheel is not repaired to carry its own copy)
        r = subprocess.run(
            [exe, "build", "--release", "--quiet", "--auditwheel", "warn", "-o", str(built), "-i", sys.executable],
            cwd=src,
            capture_output=True,
            text=True,
            timeout=1800,
            env=build_env(),
        )
        if r.returncode != 0:
            raise ProvisionError(f"maturin build failed: {r.stderr.strip()[-800:]}")
        found = sorted(built.glob("loopscope-*.whl"))
        if not found:
            raise ProvisionError(f"maturin build wrote no wheel into {built}")
        whl = found[-1]
    else:
        whl = Path(wheel)
        if not whl.is_file():
            raise InputError(f"{wheel}: no such wheel")
    inst = next(iter(sorted(deps.glob("installer-*.whl"))), None)
    if inst is None:
        raise ProvisionError("requirements.lock has no installer wheel (PyPA's installer, which installs the wheels on the hosts)")
    version = launch.version()
    identity = f"{_identity(whl)}-{lock_id}"
    dep_wheels = [p for p in sorted(deps.glob("*.whl")) if not p.name.startswith("loopscope-")]
    manifest = {
        "version": version,
        "identity": identity,
        "python": "%d.%d" % sys.version_info[:2],
        "machine": platform.machine(),
        "installer": f"wheels/{inst.name}",
        "force": force,
    }
    return Bundle(cache / "bundle.tar", version, identity, 1 + len(dep_wheels), sum(p.stat().st_size for p in [whl, *dep_wheels]), [whl, *dep_wheels], manifest)


def pack(b: Bundle) -> None:
    """Write the tar the hosts receive (only when one needs it)."""

    with tarfile.open(b.tar, "w") as t:
        data = json.dumps(b.manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
        for p in b.files:
            t.add(p, arcname=f"wheels/{p.name}")


class HostInstalled(TypedDict):
    """One host's outcome in ``hosts install --json``."""

    host: str
    outcome: str
    detail: str
    seconds: float
    python: str | None


class InstallJson(TypedDict):
    """What ``loopscope hosts install --json`` prints: the bundle sent and each host's outcome."""

    version: str
    build: str
    wheels: int
    bytes: int
    hosts: list[HostInstalled]


@dataclass
class Installed:
    host: str
    outcome: str  # installed, current, refused, failed
    detail: str
    seconds: float
    python: str | None = None


def _line(host: Host) -> str:
    return f"exec {shlex.quote(host.system_python)} -c {shlex.quote(BOOTSTRAP)} {shlex.quote(host.install_dir)}"


def _outcome(name: str, rc: int | None, out: str, t0: float) -> Installed:
    lines = [l for l in out.splitlines() if l.strip()]
    last = lines[-1] if lines else ""
    dt = round(time.monotonic() - t0, 2)
    for word, outcome in ((DONE, "installed"), (ALREADY, "current")):
        if last.startswith(word + " ") and rc == 0:
            _, version, py = last.split(" ", 2)
            return Installed(name, outcome, f"loopscope {version} in {py}", dt, py)
    if last.startswith(REFUSED + " "):
        return Installed(name, "refused", last[len(REFUSED) + 1 :], dt)
    return Installed(name, "failed", f"exit code {rc}; last output:\n{launch.tail_text(out)}", dt)


def _marker_line(host: Host) -> str:
    """Shell: print the host's install record of this version (nothing if there is none)."""
    return f'{launch.installed_python(host)}; cat "$(dirname "$(dirname "$p")")/loopscope-install.json" 2>/dev/null; true'


def current(host: Host, b: Bundle) -> Installed | None:
    """``current`` when the host already holds this build (asked before anything is sent), else None."""
    t0 = time.monotonic()
    line = _marker_line(host)
    try:
        if host.kind == "exec":
            r = subprocess.run(
                launch.argv(host, line),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
                env=launch.launcher_env("hosts-install"),
                start_new_session=True,
            )
            out = r.stdout.decode(errors="replace")
        else:
            out = _ssh_run(host, f"sh -c {shlex.quote(line)}", b"")[1]
        mark = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, RunError):
        return None
    if isinstance(mark, dict) and mark.get("identity") == b.identity:
        return Installed(
            host.name,
            "current",
            f"loopscope {b.version} in {host.install_dir}/{b.version}/bin/python",
            round(time.monotonic() - t0, 2),
            f"{host.install_dir}/{b.version}/bin/python",
        )
    return None


def install_one(host: Host, b: Bundle) -> Installed:
    t0 = time.monotonic()
    if host.kind == "exec":
        cmd = launch.argv(host, _line(host))
        try:
            with open(b.tar, "rb") as f:
                r = subprocess.run(cmd, stdin=f, capture_output=True, timeout=1800, env=launch.launcher_env("hosts-install"), start_new_session=True)
        except FileNotFoundError:
            return Installed(host.name, "failed", f"its launcher {launch.launcher(host)[0]!r} is not installed", 0.0)
        except subprocess.TimeoutExpired:
            return Installed(host.name, "failed", "no answer within 30 min", time.monotonic() - t0)
        return _outcome(host.name, r.returncode, (r.stdout + r.stderr).decode(errors="replace"), t0)
    return _install_ssh(host, b, t0)


def _ssh_run(host: Host, cmd: str, data: bytes) -> tuple[int | None, str]:
    """Run ``cmd`` on an ssh host with ``data`` on its standard input: exit status and output."""

    from loopscope.lab.hosts import SshError, connect

    async def go() -> tuple[int | None, str]:
        try:
            conn = await connect(host, 15)
        except SshError as e:
            raise RunError(str(e)) from None
        try:
            r = await conn.run(cmd, input=data, encoding=None, check=False)
            return r.exit_status, (bytes(r.stdout or b"") + bytes(r.stderr or b"")).decode(errors="replace")
        finally:
            conn.close()

    return asyncio.run(go())


def _install_ssh(host: Host, b: Bundle, t0: float) -> Installed:
    try:
        rc, out = _ssh_run(host, f"sh -c {shlex.quote(_line(host))}", b.tar.read_bytes())
    except RunError as e:
        return Installed(host.name, "failed", str(e), time.monotonic() - t0)
    return _outcome(host.name, rc, out, t0)


def install(hosts: list[Host], say: Say, force: bool = False, wheel: str | None = None) -> tuple[Bundle, list[Installed]]:
    """Every ssh and exec host of ``hosts`` brought to this controller's loopscope, side by side."""
    with _alone(say):
        b = bundle(say, wheel, force)
        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            have = list(pool.map(lambda h: None if force else current(h, b), hosts))
        todo = [h for h, c in zip(hosts, have) if c is None]
        if todo:
            pack(b)
            say(f"sending loopscope {b.version} (build {b.identity}: {b.wheels} wheels, {b.bytes / 1e6:.0f} MB) to {len(todo)} host(s) …")
            with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
                sent = dict(zip([h.name for h in todo], pool.map(lambda h: install_one(h, b), todo)))
        else:
            sent = {}
    return b, [c if c is not None else sent[h.name] for h, c in zip(hosts, have)]
