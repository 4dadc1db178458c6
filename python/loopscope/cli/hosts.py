"""`loopscope hosts`: the ssh and exec hosts of an experiment, checked and provisioned."""

from __future__ import annotations

import json
import sys
from typing import Any, TYPE_CHECKING

import click

from loopscope.cli.base import cli, prints
from loopscope.errors import EXIT_FAILED, InputError
from loopscope.kinds import KINDS
from loopscope.spec import load
from loopscope.lab import provision
from loopscope.lab import launch
from loopscope.lab.hostkinds import HOST_KINDS

if TYPE_CHECKING:
    from loopscope.lab.provision import InstallJson


@cli.group("hosts")
def hosts() -> None:
    """The ssh and exec hosts of an experiment: whether each can run it (check), and this controller's loopscope put there (install)."""


def _remote(spec: str) -> list[Any]:

    exp = load(spec, KINDS)
    found = [h for h in exp.hosts if h.remote]
    if not found:
        raise InputError(f"{spec}: has no ssh or exec hosts (hosts install and check are for those; netns and local hosts run this machine's loopscope)")
    return found


@hosts.command("install")
@click.argument("spec", type=click.Path())
@click.option("--force", is_flag=True, help="Reinstall on hosts that already hold this build.")
@click.option("--wheel", type=click.Path(dir_okay=False), default=None, help="Send this loopscope wheel instead of building one from the source tree.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object: the bundle and each host's outcome.")
@prints("loopscope.lab.provision:InstallJson")
def hosts_install(spec: str, force: bool, wheel: str | None, as_json: bool) -> int:
    """Put this controller's exact loopscope (the wheel this clone builds and its locked dependencies) on every ssh and
    exec host of SPEC that lacks it, into `install_dir/<version>` there, through the host's own launcher or ssh: the host
    reaches no package index and runs no pip. Exit 1 when a host could not be installed.

    \b
    Examples:
      loopscope hosts install fleet.yaml
      loopscope hosts install fleet.yaml --force --json
    """

    remote = _remote(spec)
    say = (lambda t: None) if as_json else (lambda t: click.echo(t, err=True))
    b, done = provision.install(remote, say, force=force, wheel=wheel)
    bad = [d for d in done if d.outcome in ("failed", "refused")]
    if as_json:
        out: InstallJson = {
            "version": b.version,
            "build": b.identity,
            "wheels": b.wheels,
            "bytes": b.bytes,
            "hosts": [{"host": d.host, "outcome": d.outcome, "detail": d.detail, "seconds": d.seconds, "python": d.python} for d in done],
        }
        click.echo(json.dumps(out))
    else:
        for d in done:
            click.echo(f"  {d.host}: {d.outcome}: {d.detail} ({d.seconds:g} s)")
    for d in bad:
        sys.stderr.write(f"loopscope: error: host {d.host}: {d.outcome}: {d.detail}\n")
    return EXIT_FAILED if bad else 0


@hosts.command("check")
@click.argument("spec", type=click.Path())
def hosts_check(spec: str) -> int:
    """Reach every ssh and exec host of SPEC as a run would (its launcher or ssh) and say which loopscope it would run;
    exit 2 naming each host that cannot run SPEC and why.

    \b
    Examples:
      loopscope hosts check fleet.yaml
    """

    remote = _remote(spec)
    problems: dict[str, str] = {}
    for name, kind in HOST_KINDS.items():
        problems |= kind.preflight([(i, h) for i, h in enumerate(remote) if h.kind == name])
    for h in remote:
        click.echo(f"  {h.name} ({h.kind}): {'ready: loopscope ' + launch.version() if h.name not in problems else 'NOT READY'}")
    if problems:
        raise InputError("\n".join(problems[h.name] for h in remote if h.name in problems))
    return 0
