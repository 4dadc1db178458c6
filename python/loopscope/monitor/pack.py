"""Kept windows packed a period at a time.

A window is first written as a capture store of its own
(``windows/NNNNNNN/``), so it can be attributed the moment it is read. A
store of some 150 events costs four file-system blocks or more (two
directories, an index line carrying the string table, a Parquet file whose
metadata outweighs its data): at an outlier a second that was twice the
monitor's disk target. So at each period's close the keeper packs the
period's windows into one store, ``windows/NNNNNNN-MMMMMMM/`` (the first and
last window ids): their events in one Parquet file (an event two
overlapping windows both held, once), one index line, and ``windows.jsonl``
with each window's id, span and losses. ``find`` gives a window by its id
(the id ``outliers.jsonl`` names) wherever it now is.

A pack is written under a dot name and renamed when whole; its windows'
own directories are removed after. A monitor killed in between leaves both,
and the next start removes the windows a pack already holds
(``tidy``). Windows whose string tables differ (kept by two readers) are
never packed together: a pack's codes have one table.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from loopscope.kernel import store as S

ONE = re.compile(r"^\d{7}$")
PACK = re.compile(r"^(\d{7})-(\d{7})$")


@dataclass
class Found:
    """A kept window: the store holding it and its own span (kernel CLOCK_MONOTONIC)."""

    store: S.Store
    t0: int
    t1: int
    lost: list[S.LostWindow]


def ids(d: Path) -> tuple[int, int] | None:
    """The window ids a directory under ``windows/`` holds (first, last), or None."""
    if ONE.match(d.name):
        return int(d.name), int(d.name)
    m = PACK.match(d.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def count(d: Path) -> int:
    """How many windows a directory under ``windows/`` holds."""
    if PACK.match(d.name):
        try:
            return sum(1 for line in (d / "windows.jsonl").read_text().splitlines() if line.strip())
        except OSError:
            r = ids(d)
            return r[1] - r[0] + 1 if r else 0
    return 1


def _prefix(a: list[str], b: list[str]) -> bool:
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    return long[: len(short)] == short


def pack(windows: list[Path]) -> list[Path]:
    """Pack these window stores (ids ascending) into as few stores as their
    string tables allow; returns the packs written. A window that cannot be
    read stays as it is."""
    runs: list[list[tuple[Path, S.Segment, pl.DataFrame]]] = []
    for d in windows:
        try:
            st = S.open_dir(d)
            seg = st.segments[0]
            f = seg.get("file")
            ev = pl.read_parquet(d / f) if f else None
        except Exception:  # noqa: BLE001 - a damaged window is left unpacked, its outliers' causes are already written
            continue
        cur = runs[-1] if runs else None
        if (
            cur
            and _prefix(cur[-1][1].get("strings") or [], seg.get("strings") or [])
            and _prefix(cur[-1][1].get("event_names") or [], seg.get("event_names") or [])
        ):
            cur.append((d, seg, ev if ev is not None else pl.DataFrame()))
        else:
            runs.append([(d, seg, ev if ev is not None else pl.DataFrame())])
    return [_write(run) for run in runs]


def _write(run: list[tuple[Path, S.Segment, pl.DataFrame]]) -> Path:
    parent = run[0][0].parent
    name = f"{run[0][0].name}-{run[-1][0].name}"
    tmp = parent / f".{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "events").mkdir(parents=True)
    frames = [ev for _, _, ev in run if len(ev)]
    events = pl.concat(frames, how="vertical_relaxed").unique(maintain_order=True).sort("t_ns", maintain_order=True) if frames else pl.DataFrame()
    lost: list[S.LostWindow] = []
    index = []
    for d, seg, ev in run:
        mine = list(seg.get("lost") or [])
        lost += [w for w in mine if w not in lost]
        index.append({"window": d.name, "t0_ns": seg.get("t_first_ns"), "t1_ns": seg.get("t_last_ns"), "events": len(ev), "lost": mine})
    longest = max((s for _, s, _ in run), key=lambda s: len(s.get("strings") or []))
    line: S.Segment = {
        "seg": 0,
        "reason": "packed",
        "label": name,
        "events": len(events),
        "t_first_ns": min(int(s.get("t_first_ns") or 0) for _, s, _ in run),
        "t_last_ns": max(int(s.get("t_last_ns") or 0) for _, s, _ in run),
        "lost": lost,
        "file": None,
        "strings": longest.get("strings") or [],
        "event_names": max((s.get("event_names") or [] for _, s, _ in run), key=len),
    }
    if len(events):
        written = S.write_segment(tmp, 0, events, sync=False, level=6)
        line["file"], line["groups"], line["bytes"] = written["file"], written["groups"], written["bytes"]
    (tmp / "segments.jsonl").write_text(json.dumps(line) + "\n")
    (tmp / "windows.jsonl").write_text("".join(json.dumps(x) + "\n" for x in index))
    final = parent / name
    tmp.rename(final)
    for d, _, _ in run:
        shutil.rmtree(d, ignore_errors=True)
    return final


def tidy(windows_dir: Path) -> None:
    """After a kill: drop a half-written pack, and windows a whole pack already holds."""
    if not windows_dir.is_dir():
        return
    packs: list[tuple[int, int]] = []
    for d in windows_dir.iterdir():
        if d.name.startswith("."):
            shutil.rmtree(d, ignore_errors=True)
        elif (r := ids(d)) is not None and PACK.match(d.name):
            packs.append(r)
    for d in windows_dir.iterdir():
        if ONE.match(d.name) and any(a <= int(d.name) <= b for a, b in packs):
            shutil.rmtree(d, ignore_errors=True)


def find(windows_dir: Path, window: str) -> Found | None:
    """The kept window ``window`` (an id of ``outliers.jsonl``), packed or not."""
    one = windows_dir / window
    if (one / "segments.jsonl").exists():
        st = S.open_dir(one)
        seg = st.segments[0]
        return Found(st, int(seg.get("t_first_ns") or 0), int(seg.get("t_last_ns") or 0), list(seg.get("lost") or []))
    n = int(window)
    for d in sorted(windows_dir.iterdir()) if windows_dir.is_dir() else []:
        r = ids(d)
        if r is not None and PACK.match(d.name) and r[0] <= n <= r[1]:
            for line in (d / "windows.jsonl").read_text().splitlines():
                w = json.loads(line)
                if w["window"] == window:
                    return Found(S.open_dir(d), int(w["t0_ns"]), int(w["t1_ns"]), S.LOST_LIST.validate_python(w["lost"]))
    return None
