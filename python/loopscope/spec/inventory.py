"""Hosts from an Ansible inventory.

A fleet that is already described for Ansible need not be described again:

    hosts:
      inventory: inventory.ini        # relative to the experiment file
      group: gateways                 # its hosts, its children groups' hosts too
      kind: exec                      # ssh (default) or exec
      launcher: [srun, "--nodelist={name}", --ntasks=1]
      workdir: /var/tmp/loopscope     # any host field: a default for every host

(or such an item among other hosts in a list). The inventory is read by
ansible-core's own parser, ``ansible-inventory --list`` (every format and
plugin Ansible reads: INI, YAML, directories, group_vars), so loopscope
never reinterprets Ansible's rules for variables and groups. Each host of
the group becomes a host of the experiment, in the inventory's order, named
by its inventory name, with:

- ``address``: ``loopscope_address``, else ``ansible_host``, else (ssh) the
  inventory name, which ssh resolves; an exec host with neither is refused;
- ``user``, ``port``, ``identity``: ``ansible_user``, ``ansible_port``,
  ``ansible_ssh_private_key_file``;
- ``system_python`` (what ``loopscope hosts install`` builds from):
  ``ansible_python_interpreter``;
- any ``loopscope_<field>`` variable (``loopscope_launcher``,
  ``loopscope_python``, ``loopscope_workdir``) sets that field;
- ``{name}``, ``{address}``, ``{user}``, ``{port}`` in the launcher's words
  are the host's own.

The optional part: ansible-core (Debian's ``ansible-core``, or ``pip install
'loopscope[ansible]'``); without it an inventory is refused with how to get it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from loopscope.errors import InputError
from loopscope.spec.hostkinds import DECLARED

#: inventory variables that set a host field
ANSIBLE_VARS = {"ansible_user": "user", "ansible_port": "port", "ansible_ssh_private_key_file": "identity", "ansible_python_interpreter": "system_python"}


class InventoryError(InputError):
    """An inventory that cannot be used: ``field`` (under the hosts item) and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def tool() -> str | None:
    """``ansible-inventory``: beside this interpreter (the extra), else on PATH (Debian's)."""
    here = Path(sys.executable).parent / "ansible-inventory"
    return str(here) if here.exists() else shutil.which("ansible-inventory")


def read(path: Path) -> dict[str, Any]:
    """The inventory as ``ansible-inventory --list`` gives it."""
    exe = tool()
    if exe is None:
        raise InventoryError(
            "inventory", "reading an Ansible inventory needs ansible-core (Debian: apt-get install ansible-core; or pip install 'loopscope[ansible]')"
        )
    if not path.exists():
        raise InventoryError("inventory", f"{path}: no such inventory file or directory")
    env = {
        **os.environ,
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }
    try:
        r = subprocess.run([exe, "-i", str(path), "--list"], capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        raise InventoryError("inventory", f"{path}: ansible-inventory did not finish within 120 s") from None
    if r.returncode != 0:
        lines = [l.strip() for l in (r.stderr or r.stdout).splitlines() if l.strip()]
        said = "; ".join(lines[-4:]) or f"exit code {r.returncode}"
        raise InventoryError("inventory", f"{path}: Ansible cannot parse it: {said}")
    try:
        got = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise InventoryError("inventory", f"{path}: ansible-inventory printed no inventory") from None
    return got if isinstance(got, dict) else {}


def members(inv: dict[str, Any], group: str) -> list[str]:
    """The hosts of ``group`` and its children, in the inventory's order, each once."""
    out: list[str] = []
    seen: set[str] = set()

    def walk(g: str) -> None:
        if g in seen:
            return
        seen.add(g)
        node = inv.get(g) or {}
        for h in node.get("hosts") or []:
            if h not in out:
                out.append(h)
        for c in node.get("children") or []:
            walk(c)

    walk(group)
    return out


def _groups(inv: dict[str, object]) -> list[str]:
    return sorted(k for k in inv if k != "_meta")


def hosts_of(item: dict[str, object], base: Path) -> list[dict[str, object]]:
    """The hosts an inventory item stands for, as host mappings of the experiment file."""
    item = dict(item)
    src = item.pop("inventory")
    group = item.pop("group", "all")
    if not isinstance(src, str) or not src:
        raise InventoryError("inventory", "must be the path of an Ansible inventory (a file or directory)")
    if not isinstance(group, str):
        raise InventoryError("group", "must be the name of a group of the inventory")
    path = Path(src) if os.path.isabs(src) else base / src
    inv = read(path)
    if group != "all" and group not in inv:
        raise InventoryError("group", f"{path} has no group {group!r}; its groups are {', '.join(_groups(inv)) or '(none)'}")
    names = members(inv, group)
    if not names:
        raise InventoryError("group", f"group {group!r} of {path} has no hosts")
    hostvars = (inv.get("_meta") or {}).get("hostvars") or {}
    kind = item.get("kind", "ssh")
    out = []
    for name in names:
        v = hostvars.get(name) or {}
        h: dict[str, Any] = {**item, "name": name, "kind": kind}
        for var, fld in ANSIBLE_VARS.items():
            if var in v:
                h[fld] = v[var]
        for var, val in v.items():
            if var.startswith("loopscope_"):
                h[var[len("loopscope_") :]] = val
        address = v.get("loopscope_address") or v.get("ansible_host") or (name if getattr(DECLARED.get(str(h["kind"])), "connects_by_name", False) else None)
        if not address:
            raise InventoryError(
                "group", f"host {name} of {path} has no address: set ansible_host or loopscope_address for it (an exec host's network probes need one)"
            )
        h["address"] = str(address)
        if isinstance(h.get("launcher"), list):
            fill = {"name": name, "address": h["address"], "user": h.get("user") or "", "port": h.get("port") or ""}
            h["launcher"] = [str(w).format(**fill) if isinstance(w, str) else w for w in h["launcher"]]
        out.append(h)
    return out


def expand(data: dict[str, Any], base: Path) -> list[tuple[int, InventoryError]]:
    """``data['hosts']`` with every inventory item replaced by its hosts; the
    problems found, by the index of the item at fault."""
    hosts = data.get("hosts")
    items = [hosts] if isinstance(hosts, dict) else hosts if isinstance(hosts, list) else None
    if items is None or not any(isinstance(i, dict) and "inventory" in i for i in items):
        return []
    problems: list[tuple[int, InventoryError]] = []
    out: list[Any] = []
    for i, it in enumerate(items):
        if isinstance(it, dict) and "inventory" in it:
            try:
                out += hosts_of(it, base)
            except InventoryError as e:
                problems.append((i, e))
        else:
            out.append(it)
    data["hosts"] = out
    return problems
