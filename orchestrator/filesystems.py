"""Which filesystem a path lives on, and whether other hosts may share it (DESIGN.md decision 16).

SQLite's locks and WAL's shared memory hold among the processes of one host; over a network
filesystem (NFS, Lustre, GPFS, BeeGFS, CIFS, sshfs) two hosts writing one file lose rows and
corrupt it with every COMMIT returning success (measured: tests/shared_fs_sqlite.py). So a SQLite
file on such a filesystem gets a rollback journal instead of WAL (``orchestrator/registry/db.py``)
and is written from one host only: through the sweep's writer (``orchestrator/driving/writer.py``).

The type is read from ``/proc/self/mountinfo`` (the mount whose point is the longest prefix of the
path: what ``statfs`` would name), so it sees the mounts of this process's mount namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "fuse.ceph-fuse", "fuse.sshfs",
    "fuse.gcsfuse", "fuse.s3fs", "fuse.glusterfs", "glusterfs", "9p", "afs", "ocfs2", "gfs2", "pvfs2", "orangefs",
    "fuse.juicefs", "fuse.weka", "wekafs",
})
"""Filesystem types whose files hosts share over a network (mountinfo's names)."""


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash in paths as octal (``\\040``)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts(mountinfo: str) -> list[tuple[str, str]]:
    """``(mount point, filesystem type)`` of each line of a ``/proc/self/mountinfo`` text."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        found.append((_unescape(fields[4]), after[0] if after else ""))
    return found


def filesystem_type(path: str | os.PathLike[str], mountinfo: str | None = None) -> str:
    """The type of the filesystem ``path`` is on (``ext4``, ``nfs4``, ``fuse.sshfs``, ...): the mount
    of its nearest existing folder (symbolic links resolved), the last one when several are stacked.
    ``mountinfo``: a ``/proc/self/mountinfo`` text to read instead of this process's (then ``path``
    is taken as it is)."""
    target = Path(os.path.abspath(path))
    if mountinfo is None:
        while not target.exists() and target != target.parent:
            target = target.parent
        target = target.resolve()
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return ""
    best, kind = -1, ""
    for point, fstype in mounts(mountinfo):
        inside = target == Path(point) or Path(point) in target.parents
        if inside and len(point) >= best:
            best, kind = len(point), fstype
    return kind


def on_network_filesystem(path: str | os.PathLike[str], mountinfo: str | None = None) -> bool:
    """Whether ``path`` is on a filesystem other hosts may share (:data:`NETWORK_FILESYSTEMS`)."""
    kind = filesystem_type(path, mountinfo)
    return kind in NETWORK_FILESYSTEMS or kind.startswith("nfs")


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///PATH`` URL (registry or MLflow), None for any other URL or memory."""
    if not url.startswith("sqlite:"):
        return None
    path = url.split("sqlite:///", 1)[1] if "sqlite:///" in url else ""
    path = path.split("?", 1)[0]
    return None if path in ("", ":memory:") else path
