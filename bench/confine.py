"""The kernel's half of a plugin worker's confinement: a file system it can read but not write, and the runner's
files out of its sight.

The audit hook (bench/sandbox.py) refuses Python-level writes outside a worker's directory, but C code does not
raise audit events: SQLite writes its files itself, and ``ctypes`` reaches libc. So a worker that starts in a user
namespace of its own with a mount namespace (``unshare --user --mount --map-root-user``) calls :func:`confine`
before the plugin is imported. As root of that namespace, over its private copy of the mount table, it

* mounts an empty, read-only tmpfs over each hidden directory (the submission's sandbox, with its scratch database
  and cache overlay; the shared artifact cache, with the task corpora), and a fresh tmpfs of its own on
  ``/dev/shm``;
* keeps its own directory writable (bound back into place where a hidden directory covered it);
* remounts every other mount read-only, keeping its nosuid/nodev/noexec flags (the kernel refuses to drop them).

Nothing here leaves the worker: the namespace ends with it. A mount inherited from the parent namespace cannot be
made writable again from inside (Linux locks the flags of mounts copied into a less privileged namespace), but
the read-only flags set here are the worker's own, so the plugin, root in the namespace, could remount them
writable with ``mount(2)`` through ``ctypes``: the same class of bypass as for the audit hook, which is why runs
outside CI are marked unverified. What it closes is every ordinary path: ``sqlite3``, ``open`` in C extensions,
``os.walk`` into the runner's files.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from functools import lru_cache

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
#: per-mount flags a remount must keep (the kernel refuses to clear a locked one)
_KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
#: file systems left as they are: the kernel's views (their writes are checked by permissions, not the mount)
_PSEUDO = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs", "tracefs",
                     "pstore", "bpf", "fusectl", "configfs", "binfmt_misc", "hugetlbfs", "autofs", "efivarfs",
                     "nsfs", "rpc_pipefs"})


class ConfinementError(OSError):
    """A mount the confinement needs failed: the worker must not run the plugin."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda v: None if v is None else os.fsencode(v))
    if _libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        what = f"mount {source} on {target}" if source else f"remount {target}"
        raise ConfinementError(err, f"{what}: {os.strerror(err)}")


def _unescape(field: str) -> str:
    """A mount point as /proc/self/mountinfo writes it (space, tab, newline, backslash as octal escapes)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts() -> list[tuple[str, str, frozenset[str]]]:
    """(mount point, file system type, per-mount options) of every mount this process sees, parents first."""
    rows = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            rows.append((_unescape(fields[4]), tail[0] if tail else "", frozenset(fields[5].split(","))))
    return rows


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def confine(workdir: str, hidden: Sequence[str]) -> None:
    """Make this process's file system read-only but ``workdir``, and ``hidden`` directories empty. Run as root of
    a new user + mount namespace, before untrusted code. Raises :class:`ConfinementError` if a mount fails."""
    work = os.path.realpath(workdir)
    hide = [os.path.realpath(h) for h in hidden if os.path.isdir(h)]
    # a hidden directory that holds the workdir is covered after the workdir is reachable from a descriptor
    keep = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _mount(work, work, None, MS_BIND)  # its own mount: stays writable when its parent goes read-only
        for h in sorted(hide, key=len, reverse=True):
            if _under(h, work):
                continue
            _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k")
            if _under(work, h):
                os.makedirs(work, exist_ok=True)
                _mount(f"/proc/self/fd/{keep}", work, None, MS_BIND)
            _mount(None, h, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        if os.path.isdir("/dev/shm"):
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m")
    finally:
        os.close(keep)
    for point, fstype, opts in mounts():
        if fstype in _PSEUDO or _under(point, work) or point == "/dev/shm" or "ro" in opts:
            continue
        if any(_under(point, h) and point != h for h in hide):
            continue  # beneath a hidden directory: out of sight already
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in _KEPT.items():
            if name in opts:
                flags |= bit
        try:
            _mount(None, point, None, flags)
        except ConfinementError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES) or (exc.errno == errno.EINVAL and not os.path.ismount(point)):
                continue  # a mount point this namespace cannot reach (shadowed by a later mount): nothing to write
            raise
    os.chdir(work)  # the old working directory lies on the read-only mount beneath; this one is writable


@lru_cache(maxsize=1)
def confinement_available() -> bool:
    """Whether a worker can be confined here: probed once by confining a throw-away process in a new user +
    mount namespace and trying to write outside its directory (must fail with EROFS) and inside (must work)."""
    import subprocess
    import sys
    import tempfile
    if os.environ.get("PRIVBENCH_NO_CONFINE") == "1":
        return False
    with tempfile.TemporaryDirectory(prefix="privbench-confine-probe-") as d:
        work, outside = os.path.join(d, "work"), os.path.join(d, "outside")
        os.mkdir(work)
        code = ("import errno, os, sys\n"
                "from bench.confine import confine\n"
                "confine(sys.argv[1], [])\n"
                "open(os.path.join(sys.argv[1], 'ok'), 'w').write('ok')\n"
                "try:\n    open(sys.argv[2], 'w')\n"
                "except OSError as e:\n    print('refused' if e.errno == errno.EROFS else 'other')\n"
                "else:\n    print('written')")
        try:
            proc = subprocess.run(["unshare", "--user", "--mount", "--map-root-user", sys.executable, "-c", code,
                                   work, outside], capture_output=True, text=True, timeout=30, cwd=work)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return (proc.returncode == 0 and proc.stdout.strip() == "refused" and not os.path.exists(outside)
                and os.path.exists(os.path.join(work, "ok")))
