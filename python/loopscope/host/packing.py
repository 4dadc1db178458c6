"""An agent's files brought home through its own channel.

A host reached through a launcher (srun, kubectl exec, docker exec, ip
netns exec) writes its run's files where it runs; nothing guarantees a copy
tool on either side (no scp, no shared file system, no kubectl cp), only the
agent's standard input and output. So at the end the controller asks the
agent to pack its run directory into one gzip-compressed tar file
(``pack_files``), reads it back in chunks carried as base64 in ordinary
replies (``read_packed``), and unpacks it at home; ``drop_files`` then
removes the packed file and the run directory on the host. The stream is
checked end to end: the agent says the packed file's size and SHA-256, the
controller compares what it got.

Chunks are requests of their own, so a large run never holds the channel
in one reply and a reply is never larger than ``CHUNK`` × 4/3.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

#: bytes of packed file per read_packed reply
CHUNK = 4 << 20


class Packed:
    """The packed file of one directory, on the agent's side."""

    def __init__(self, root: Path) -> None:
        self.root = root
        fd, name = tempfile.mkstemp(prefix="loopscope-pack-", suffix=".tar.gz")
        os.close(fd)
        self.path = Path(name)
        files = 0
        # gzip level 1: a trace compresses by half at a fraction of the CPU level 9 takes
        with tarfile.open(self.path, "w:gz", compresslevel=1) as tar:
            if root.exists():
                for p in sorted(root.rglob("*")):
                    if p.is_file() and not p.is_symlink():
                        tar.add(p, arcname=str(p.relative_to(root)), recursive=False)
                        files += 1
        self.files = files
        self.size = self.path.stat().st_size
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        self.sha256 = h.hexdigest()

    def read(self, offset: int, size: int) -> tuple[str, bool]:
        """base64 of ``size`` bytes from ``offset``, and whether that reached the end."""
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read(min(size, CHUNK))
        return base64.b64encode(data).decode(), offset + len(data) >= self.size

    def drop(self, remove_root: bool) -> None:
        self.path.unlink(missing_ok=True)
        if remove_root:
            shutil.rmtree(self.root, ignore_errors=True)
            try:  # the run's directory on the host, once its last host's files are home
                self.root.parent.rmdir()
            except OSError:
                pass


def unpack(chunks: list[bytes], sha256: str, into: Path) -> int:
    """Check and unpack what ``read_packed`` returned into ``into``: the number of files."""
    data = b"".join(chunks)
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(f"the packed files arrived damaged (SHA-256 {got[:12]}…, the host packed {sha256[:12]}…)")
    into.mkdir(parents=True, exist_ok=True)
    import io

    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(into, members=members, filter="data")
        n = len(members)
    return n


def decode(chunk: str) -> bytes:
    return base64.b64decode(chunk)
