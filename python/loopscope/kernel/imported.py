"""Recordings of other tools as loopscope runs: ``loopscope import FILE``.

trace-cmd's ``trace.dat`` (versions 6 and 7, compressed or not) and
``perf.data`` (tracepoint samples: ``perf sched record``, ``perf record -e
'sched:*' …``) are decoded natively (``loopscope._native.KtraceImport``:
crates/ktrace ``tracedat``/``import``) a batch at a time, in time order, into
the capture format loopscope's own reader writes (``tracefs-segments/1``:
``segments.jsonl`` and ``events/NNNNN.parquet`` under
``hosts/<host>/kernel/``), so ``explain``, ``threads`` and the Perfetto
export read an imported run like any other. Memory is that of one batch
(``BATCH`` records), not of the file.

Nothing is lost silently: the recorder's losses (a page's missed-events
flag in a trace.dat, perf's LOST and LOST_SAMPLES records) become loss
windows on their CPU, from the last event that arrived to the first after;
a loss whose place the file does not say counts against every window; a
format that does not parse is named and its records counted as unknown. The
run record says where the capture came from (file, size, format, version,
recorder, machine, clock): an imported run's stamps are on the recording's
clock (trace-cmd's default ``local``, perf's ``perf`` clock), not this
machine's CLOCK_MONOTONIC.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING


from typing_extensions import TypedDict

from loopscope.errors import InputError, RunError
from loopscope.kernel import segments as S
from loopscope import _native, lazy
import shutil

if TYPE_CHECKING:
    from loopscope._native import _ImportMeta as ImportMeta

# Records per segment: some 50 MB of decoded columns at a time. Half a million rather than a million: the last
# segment's write is the import's tail, with nothing to decode beside it (a 4.6 M-event perf.data 0.99 -> 0.86 s,
# an 8.4 M-event trace.dat 1.62 -> 1.56 s, 220 MB less at peak; `threads` reads the smaller files as fast).
BATCH = 1 << 19
TRACE_DAT_MAGIC = b"\x17\x08\x44tracing"
PERF_MAGIC = b"PERFILE2"
FORMAT = "tracefs-segments/1"


class Source(TypedDict, total=False):
    """Where an imported capture came from (run.json ``kernel.captures[].imported``)."""

    file: str
    bytes: int
    format: str
    version: int
    recorder: str | None
    machine: str | None
    command: str | None
    clock: str
    compression: str | None
    cpus: int | None
    notes: list[str]


class Imported(TypedDict):
    """What ``loopscope import --json`` prints."""

    run_dir: str
    format: str
    version: int
    kernel_events: int
    lost_kernel_events: int
    lost_windows: int
    lost_unknown_windows: int
    segments: int
    events_per_s: float
    seconds: float
    notes: list[str]


def kind_of(path: Path) -> str:
    """``trace.dat`` or ``perf.data`` by the file's first bytes (InputError otherwise)."""
    try:
        with open(path, "rb") as f:
            head = f.read(10)
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    if head == TRACE_DAT_MAGIC:
        return "trace.dat"
    if head[:8] == PERF_MAGIC:
        return "perf.data"
    if head[:8] == b"2ELIFREP":
        raise InputError(f"{path}: a big-endian perf.data; loopscope reads little-endian recordings only")
    if head[:8] == b"PERFILE":
        raise InputError(f"{path}: a perf.data of the first format version (PERFILE); record it again with a perf of the last ten years")
    raise InputError(f"{path}: neither a trace-cmd trace.dat nor a perf.data (its first bytes are {head[:10]!r})")


def _write_formats(d: Path, header_page: str, formats: list[tuple[str, str]], wanted: set[str]) -> None:
    """The descriptions the events were decoded with, as the live capture keeps them."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "header_page").write_text(header_page)
    for sys_name, text in formats:
        m = re.search(r"^name:\s*(\S+)", text, re.M)
        if m and m.group(1) in wanted:
            (d / sys_name).mkdir(exist_ok=True)
            (d / sys_name / f"{m.group(1)}.format").write_text(text)


def _counted_not_placed(stats: list[str], placed: dict[int, int], span: tuple[int, int]) -> list[S.LostWindow]:
    """Per CPU, the events its buffer's counters (CPUSTAT: overrun, commit
    overrun, dropped events) say were lost beyond those its pages placed: a
    window over the whole recording, for no page said where."""
    out: list[S.LostWindow] = []
    if span[0] > span[1]:
        return out
    for text in stats:
        kv = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()) if v.strip())
        if not kv.get("CPU", "").isdigit():
            continue
        n = sum(int(kv[k]) for k in ("overrun", "commit overrun", "dropped events") if kv.get(k, "").isdigit())
        cpu = int(kv["CPU"])
        if n > placed.get(cpu, 0):
            out.append(
                {
                    "cpu": cpu,
                    "start_ns": span[0],
                    "end_ns": span[1],
                    "events": n - placed.get(cpu, 0),
                    "why": "the buffer's counters (trace-cmd's CPUSTAT; no page said where)",
                }
            )
    return out


def _source(path: Path, kind: str, meta: ImportMeta, notes: list[str]) -> Source:
    def s(k: str) -> str | None:
        v = meta.get(k)
        return str(v) if v not in (None, "") else None

    cpus = meta.get("nr_cpus") or meta.get("cpu_count")
    return {
        "file": str(path.resolve()),
        "bytes": path.stat().st_size,
        "format": kind,
        "version": int(str(meta.get("version") or 0)),
        "recorder": f"perf {s('perf_version')}"
        if kind == "perf.data" and s("perf_version")
        else (f"trace-cmd {s('tool_version')}" if s("tool_version") else None),
        "machine": " ".join(x for x in (s("hostname"), s("os_release") or s("uname")) if x) or None,
        "command": s("command"),
        "clock": str(meta.get("clock") or "local"),
        "compression": s("compression"),
        "cpus": int(str(cpus)) if cpus else None,
        "notes": notes,
    }


def import_file(path: Path, out: Path, host: str | None = None, sorted_reader: bool = False) -> Imported:
    """Decode ``path`` into a new run directory ``out`` (which must not exist).
    ``sorted_reader``: a perf.data's records through the linux-perf-data
    crate's sorted reader even where they can be walked in file order (the
    slower way, kept to compare with and to fall back on)."""
    # the run record's types are needed only at the end: they load while the first batch decodes
    types = lazy.meanwhile("loopscope.rundir")
    try:
        return _import(path, out, host, sorted_reader)
    finally:
        types.join()


def _import(path: Path, out: Path, host: str | None, sorted_reader: bool) -> Imported:
    kind = kind_of(path)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: exists and is not empty; give a new directory with -o")
    imp = _native.KtraceImport(str(path), kind, sorted_reader=sorted_reader)
    meta = imp.meta()
    uname = str(meta.get("uname") or "").split()
    host = host or str(meta.get("hostname") or "") or (uname[1] if len(uname) > 1 else "") or "imported"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", host):
        raise InputError(f"--host {host!r}: a host name is letters, digits, '.', '_' and '-'")
    notes = _file_notes(meta, kind)
    cap_dir = out / "hosts" / host / "kernel"
    (cap_dir / "events").mkdir(parents=True)
    t0 = time.perf_counter()
    d = _decode(imp, cap_dir, kind, path.name)
    if kind == "trace.dat" and (meta.get("buffers") or [""])[0] == "":
        # the top buffer's own counters (trace-cmd keeps them): what its pages did not say
        extra = _counted_not_placed(meta["cpustats"], d.placed, d.span)
        if extra:
            seg = {
                "seg": d.segments,
                "reason": "the buffer's counters",
                "label": path.name,
                "events": 0,
                "t_first_ns": None,
                "t_last_ns": None,
                "lost": extra,
                "file": None,
            }
            with open(cap_dir / "segments.jsonl", "a") as index:
                index.write(json.dumps(seg) + "\n")
            d.lost_events += sum(w["events"] for w in extra)
            d.lost_windows += len(extra)
    secs = time.perf_counter() - t0
    # damage read past (a chunk that does not decompress, records that stop reading): what was whole is imported,
    # each cut is a loss window of unknown size in the capture, and said here
    notes += [f"damaged: {w}" for w in imp.damage()]
    if kind == "perf.data":
        pc = imp.perf_counts()
        if pc and pc[1]:
            notes.append(f"{pc[1]:,} samples were not tracepoints (no raw payload) and are left out")
    _write_formats(cap_dir / "formats", str(meta["header_page"]), list(meta["formats"]), d.present)
    if d.total == 0:
        notes.append("the recording holds no events")
    src = _source(path, kind, meta, notes)
    _write_record(out, host, path, kind, src, sorted(d.present), notes, int(str(meta.get("page_size") or 0)) or None)
    return {
        "run_dir": str(out),
        "format": kind,
        "version": src["version"],
        "kernel_events": d.total,
        "lost_kernel_events": d.lost_events,
        "lost_windows": d.lost_windows,
        "lost_unknown_windows": d.lost_unknown,
        "segments": d.segments,
        "seconds": secs,
        "events_per_s": d.total / secs if secs > 0 else 0.0,
        "notes": notes,
    }


def _file_notes(meta: ImportMeta, kind: str) -> list[str]:
    """What the file itself says a reader should know: formats that do not parse, the recorder's notes, buffers left out."""
    notes: list[str] = (
        [f"{len(meta['bad_formats'])} event format(s) in the file do not parse; their records count as unknown: " + "; ".join(meta["bad_formats"][:3])]
        if meta["bad_formats"]
        else []
    )
    notes += [n for n in meta["cpustats"] if n.startswith("note:")]
    if kind == "trace.dat" and len(meta.get("buffers") or []) > 1:
        notes.append(
            f"the file holds {len(meta['buffers'])} buffers ({', '.join(b or 'top' for b in meta['buffers'])}); "
            f"{meta['buffers'][0] or 'top'!r}, the one with the most data, is imported"
        )
    return notes


@dataclass
class _Decoded:
    """What the decoding pass counted: events, segments, lost windows (and where), the events present and the span."""

    total: int = 0
    segments: int = 0
    lost_events: int = 0
    lost_windows: int = 0
    lost_unknown: int = 0
    present: set[str] = field(default_factory=set)
    placed: dict[int, int] = field(default_factory=dict)  # per CPU, the lost events the pages said
    span: tuple[int, int] = (2**63 - 1, -(2**63))


#: segment files written at once while the next batch is decoded (a batch is some 50 MB in memory)
WRITERS = 2


def _decode(imp: _native.KtraceImport, cap_dir: Path, kind: str, label: str) -> _Decoded:
    """Every batch of the file decoded and written as a segment. The batch's
    events stay native: the segment writer (crates/ktrace ``segment``) cuts
    them, in order (sorted after what the last cut held back; what lies at
    or after the reader's watermark waits for the next batch, since a
    trace.dat's last pages of a batch can end after the next pages begin,
    and overlapping segments sent every read across them down the slow,
    re-sorting path), and writes each cut as Parquet on one of ``WRITERS``
    threads while the next batch is decoded (none holds the interpreter
    lock): ``WRITERS`` + 1 batches in memory at most."""
    d = _Decoded()
    n_strings = -1
    pending: list[Future[S.Segment]] = []
    # zstd level 1: an import is written once, fast. A trace.dat's batches fill the columns of written ones again
    # (busy-v7 x0.94); a perf.data's decoding was slower in them (x1.16, its user time +0.17 s), so it takes new ones
    writer = _native.KtraceSegments(str(cap_dir), 1, recycle=kind == "trace.dat")

    def write(seg: S.Segment, batch: _native.KtraceBatch, switch: int) -> S.Segment:
        try:
            w = writer.write(batch, int(seg["seg"] or 0), switch)
        except RunError as e:
            raise RunError(f"{cap_dir}: cannot write the imported events ({e})", component="import") from None
        seg["events"], seg["t_first_ns"], seg["t_last_ns"] = w["events"], w["t_first_ns"], w["t_last_ns"]
        if w["file"] is not None:
            seg["file"], seg["groups"], seg["bytes"] = w["file"], w["groups"], w["bytes"]
            if "names" in w:
                seg["names"] = w["names"]
        return seg

    with open(cap_dir / "segments.jsonl", "w") as index, ThreadPoolExecutor(WRITERS, thread_name_prefix="ls-import-write") as pool:

        def done(upto: int) -> None:
            # the index in segment order: the oldest writes first
            while len(pending) > upto:
                index.write(json.dumps(pending.pop(0).result()) + "\n")

        more = True
        while more:
            t_read = time.perf_counter_ns()
            more = imp.next(BATCH)
            got = imp.take_batch()
            lost = S.lost_list(got)
            n = got["n"]
            seg: S.Segment = {
                "seg": d.segments,
                "reason": f"imported from {kind}",
                "label": label,
                "read_ns": time.perf_counter_ns() - t_read,
                "events": n,
                "t_first_ns": None,
                "t_last_ns": None,
                "lost": lost,
                "file": None,
                "counts": got["counts"],
            }
            if len(got["strings"]) != n_strings:
                seg["strings"], seg["event_names"] = got["strings"], got["events"]
                n_strings = len(got["strings"])
            if not n and not lost and more:
                continue
            d.present.update(got["events"][i] for i in got["present"])
            cut = writer.cut(got["batch"], imp.watermark_ns() if more else None)
            done(WRITERS - 1)
            pending.append(pool.submit(write, seg, cut, S.switch_code(got["events"])))
            d.segments += 1
            d.total += n
            d.lost_events += sum(max(0, w["events"]) for w in lost)
            d.lost_windows += len(lost)
            d.lost_unknown += sum(1 for w in lost if w["events"] < 0)
            for w in lost:
                d.placed[w["cpu"]] = d.placed.get(w["cpu"], 0) + max(0, w["events"])
            if got["t_min"] is not None and got["t_max"] is not None:
                d.span = (min(d.span[0], got["t_min"]), max(d.span[1], got["t_max"]))
        done(0)
    return d


def _write_record(out: Path, host: str, path: Path, kind: str, src: Source, present: list[str], notes: list[str], page_size: int | None) -> None:
    """The imported run's record: one host, its capture, and what the file said about itself."""
    from loopscope.rundir import Capture, KernelRecord, RunDir, RunRecord  # loaded meanwhile (``import_file``)

    missing = [e for e in ("sched_switch",) if e not in present] + ([] if set(present) & {"sched_wakeup", "sched_waking"} else ["sched_wakeup or sched_waking"])
    cap = Capture.model_validate(
        {
            "host": host,
            "covers": [host],
            "dir": f"hosts/{host}/kernel",
            "data": f"hosts/{host}/kernel",
            "format": FORMAT,
            "tool": "trace-cmd" if kind == "trace.dat" else "perf",
            "read": "imported",
            "clock": src["clock"],
            "events": present,
            "missing_events": missing,
            "page_size": page_size,
            "imported": src,
        }
    )
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rec = RunRecord(
        run_id=out.name,
        name=f"import-{path.stem}",
        status="imported",
        started_utc=now,
        ended_utc=now,
        command=list(sys.argv),
        notes=[f"imported from {path} ({kind} version {src['version']}); its times are on the recording's {src['clock']!r} clock", *notes],
        hosts={host: "imported"},
        kernel=KernelRecord(captures=[cap]),
    )
    RunDir(out).write_record(rec)


def default_dir(path: Path) -> Path:
    """``runs/<YYYYmmdd-HHMMSS>-import-<name>``, numbered when it exists."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-import-{re.sub(r'[^A-Za-z0-9_.-]', '_', path.stem) or 'trace'}"
    d, n = base, 1
    while d.exists():
        n += 1
        d = base.with_name(f"{base.name}-{n}")
    return d


def remove_partial(out: Path) -> None:
    """A failed import leaves nothing behind."""

    if out.exists():
        shutil.rmtree(out, ignore_errors=True)
    try:
        os.rmdir(out.parent)
    except OSError:
        pass
