"""``loopscope advise``: the top causes ``explain`` found, each with a remedy,
and a follow-up experiment that tries the remedies it can apply at run time.

For every probe and phase the causes that took at least 5 % of the
outliers' time (up to three, the time a thread needs to return to user space
and what no capture covered left out) get a remedy from ``remedies.py``. The
follow-up experiment is the run's own (as it ran: ``spec.json``), its phases
written out, then one remedy phase per advised phase (``remedy``, or
``remedy-<phase>`` when several are advised): the advised phase's loads
with the runtime-applicable remedies as its ``tunings:``. Running it, the
run's own comparisons show whether the remedy helped (``docs/compare.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from loopscope.analysis.explained import ExplainDoc
from loopscope.analysis.remedies import Context, Remedy, by_hand, iso_remedy, partition, remedy
from loopscope.errors import InputError
from loopscope.rundir import RunDir
from loopscope.spec.models import Tuning
import os
import yaml

SKIP = {"return to user space", "unexplained"}
MIN_SHARE = 0.05


class Advice(TypedDict):
    """One cause of one probe and phase, and what to do about it."""

    probe: str
    phase: str
    cause: str
    share: float
    remedy: str
    knob: str | None
    command: str | None
    reboot: bool | None
    runtime: bool
    #: None: the follow-up applies it; else why it does not (said, never dropped silently)
    left_out: str | None


class AdviseJson(TypedDict):
    """What ``loopscope advise --json`` prints: the rows, and the follow-up experiment written (None: no remedy a phase can apply)."""

    advice: list[Advice]
    follow_up: str | None


#: per advised phase, the tunings its remedy phase applies
Remedies = dict[str, list[Tuning]]


def _probe_of(group: str, probes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The spec probe behind an explain group (a pipeline's stages are ``<probe> <stage> stack (<host>)``)."""
    for p in probes:
        if group == p.get("name") or group.startswith(f"{p.get('name')} "):
            return p
    return None


def advise(run_dir: Path, explained: ExplainDoc, models: dict[str, type[Any]], own: dict[str, frozenset[str]] | None = None) -> tuple[list[Advice], Remedies]:
    """The advice rows, and per advised phase the tunings a remedy phase applies.
    ``models``: probe kind → its spec model (what fields a probe takes);
    ``own``: probe kind → the names of its probe's own threads."""
    own = own or {}
    rd = RunDir.open(run_dir)
    spec = rd.spec()
    first = next(iter(rd.provenance().hosts.values()), None)

    usable = list((first.cpu.usable_cpus if first is not None and first.cpu is not None else None) or sorted(os.sched_getaffinity(0)))
    phases = {p["name"]: p for p in spec.get("phases") or []}
    load_cpus: dict[tuple[str, str], list[int]] = {}
    for ld in rd.record().loads:
        if ld.cpus:
            load_cpus[(ld.phase, ld.name)] = sorted(set(load_cpus.get((ld.phase, ld.name), [])) | set(ld.cpus))
    rows: list[Advice] = []
    applied: dict[str, list[tuple[Tuning, str]]] = {}  # per phase, the follow-up's tunings and whose remedy each is
    for g in explained["groups"]:
        p = _probe_of(g["probe"], spec.get("probes") or [])
        if p is None:
            continue
        fields = getattr(models.get(p["kind"]), "model_fields", {})
        # a probe that does not say its CPUs (a program that pins itself) is where its outliers ran
        ctx = Context(
            probe=p["name"],
            probe_kind=p["kind"],
            probe_cpus=list(p.get("cpu") or g.get("cpus") or []),
            usable=usable,
            probe_takes_cpu="cpu" in fields,
            probe_takes_priority="priority" in fields,
            loads=list((phases.get(g["phase"]) or {}).get("loads") or []),
            load_cpus={n: c for (ph, n), c in load_cpus.items() if ph == g["phase"]},
            probe_priority=p.get("priority"),
            probe_unlocked="mlock" in fields and not p.get("mlock", fields["mlock"].default if "mlock" in fields else True),
            own_threads=own.get(p["kind"], frozenset()),
        )
        top = [(c["cause"], c["share"] or 0.0) for c in g["causes"] if c["cause"] not in SKIP and (c["share"] or 0.0) >= MIN_SHARE][:3]
        for cause, share in top:
            r = remedy(cause, ctx)
            row: Advice = {
                "probe": g["probe"],
                "phase": g["phase"],
                "cause": cause,
                "share": round(share, 4),
                "remedy": r.remedy if r else "none known: see docs/explain.md for what it is",
                "knob": r.knob if r else None,
                "command": r.command if r else None,
                "reboot": r.reboot if r else None,
                "runtime": bool(r and r.tunings),
                "left_out": None,
            }
            row["left_out"] = _left_out(r, ctx, g["phase"] in phases, f"{g['probe']}: {cause}", applied.setdefault(g["phase"], []))
            rows.append(row)
        # several intruders on a pinned probe's CPU, none the lab's: one partition moves them all
        if (iso := partition(ctx, [(c["cause"], c["share"] or 0.0) for c in g["causes"]])) is not None:
            row = {**iso, "probe": g["probe"], "phase": g["phase"], "left_out": None}  # type: ignore[typeddict-item]
            row["left_out"] = _left_out(iso_remedy(ctx), ctx, g["phase"] in phases, f"{g['probe']}: {iso['cause']}", applied.setdefault(g["phase"], []))
            rows.append(row)
    return rows, {ph: [t for t, _ in ts] for ph, ts in applied.items() if ts}


def _left_out(r: Remedy | None, ctx: Context, phase_known: bool, whose: str, have: list[tuple[Tuning, str]]) -> str | None:
    """Why the follow-up does not apply remedy ``r`` (None: it does; its
    tunings are added to the phase's, ``have``: each with whose remedy it is)."""
    if r is None:
        return "no remedy known"
    if r.reboot:
        return "it needs a reboot"
    if not r.tunings:
        return by_hand(r, ctx)
    if not phase_known:
        return "its phase is not in the run's experiment"
    applied, clashes = 0, []
    for t in r.tunings:
        if any(h == t for h, _ in have):  # the same tuning, for another cause: applied
            applied += 1
            continue
        clash = next((w for h, w in have if _same_target(_plain(t), _plain(h))), None)
        if clash is None:
            have.append((t, whose))
            applied += 1
        elif clash not in clashes:
            clashes.append(clash)
    if applied:
        return None
    return f"the follow-up tunes the same thing otherwise, for {'; '.join(clashes)} (the first remedy of a target stays)"


def _plain(t: Tuning) -> dict[str, object]:
    """A tuning as the experiment file writes it (the fields it was given)."""
    return t.model_dump(mode="json", exclude_unset=True)


def _same_target(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two tunings of one thing (the probe's placement, one file): the first stays."""
    if a["kind"] != b["kind"]:
        return False
    key = {
        "affinity": ("probe", "load"),
        "sched": ("probe", "load"),
        "limit": ("load",),
        "irq": ("irq",),
        "write": ("path",),
        "dma_latency": (),
        "cpuidle": ("state",),
        "mlock": ("probe",),
        "isolate": (),  # one partition a phase
    }[a["kind"]]
    return all(a.get(k) == b.get(k) for k in key)


def follow_up(run_dir: Path, tunings: Remedies) -> dict[str, object]:
    """The run's experiment as its author wrote it (``spec.yaml``, defaults
    left out), its phases written out only when it had none, and a remedy
    phase per advised phase: that phase's loads, links and tunings with the
    remedy's tunings in place of any of the same target, compared with the
    phase it remedies (``compare_with``), so "did it help" is one row."""

    rd = RunDir.open(run_dir)
    if not tunings:
        raise InputError(f"{run_dir}: no cause found has a remedy a phase can apply at run time; the table above says what to change by hand")
    full = rd.spec()
    own = rd.path / "spec.yaml"
    spec = yaml.safe_load(own.read_text()) if own.exists() else None
    if not isinstance(spec, dict):
        spec = {k: full[k] for k in ("name", "hosts", "links", "probes", "loads", "duration", "repetitions") if full.get(k) not in (None, [], {})}
    spec["name"] = f"{full['name']}-remedy"[:64]
    if not spec.get("phases"):
        # the phases the run had, as few keys as they need
        spec.pop("sweep", None)
        spec["loads"] = full.get("loads") or []
        spec["phases"] = [{"name": p["name"], **({"loads": p["loads"]} if p.get("loads") else {})} for p in full.get("phases") or []]
        spec.pop("baseline", None)
    phases = spec["phases"]
    names = {p["name"] for p in phases}
    for ph, models in tunings.items():
        ts = [_plain(t) for t in models]
        base = next((p for p in phases if p["name"] == ph), None) or next(p for p in full.get("phases") or [] if p["name"] == ph)
        name = "remedy" if len(tunings) == 1 else f"remedy-{ph}"
        while name in names or name == "baseline":
            name += "-2"
        names.add(name)
        kept = [t for t in base.get("tunings") or [] if not any(_same_target(t, r) for r in ts)]
        phase: dict[str, object] = {"name": name, "compare_with": ph}
        if base.get("loads"):
            phase["loads"] = list(base["loads"])
        if base.get("links"):
            phase["links"] = list(base["links"])
        phase["tunings"] = [*kept, *ts]
        phases.append(phase)
    return spec
