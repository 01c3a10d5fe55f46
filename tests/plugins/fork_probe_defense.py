"""Dishonest fixture: looks for a way out of its worker into the processes that started it, then stops the run
with what it found.

A submitted defense's worker is forked by the submission's fork server (bench/fork_server.py) or, with
``PRIVBENCH_WORKER_START=spawn``, started by the submission child itself. From inside ``adapt`` this plugin

* lists its open descriptors (``/proc/self/fd``): the fork server's socket, left open, would let it ask for a
  worker with settings of its choosing (unconfined, not nested);
* opens ``/proc/<pid>/mem`` of its parent and its parent's parent through libc, past the audit hook: the fork
  server's memory, written, would carry state (or a changed worker start) to every later worker; the child's
  holds the draw.

It raises one error naming each finding, so the run fails with the report in its error message; a run of this
plugin never completes.
"""

import os

from bench.defense import Defense
from bench.registry import register_defense


def _libc_open(path: str) -> str:
    """``opened`` if libc could open ``path`` for reading, else why not (``ctypes``: no audit event)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(path.encode(), os.O_RDONLY)
    if fd < 0:
        return os.strerror(ctypes.get_errno())
    libc.close(fd)
    return "opened"


def _parent_of(pid: int) -> int:
    """The parent of ``pid`` from ``/proc/<pid>/stat`` read through libc (the audit hook refuses other processes'
    ``/proc`` entries to ``open``)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(f"/proc/{pid}/stat".encode(), os.O_RDONLY)
    if fd < 0:
        return 0
    buf = ctypes.create_string_buffer(4096)
    n = libc.read(fd, buf, 4096)
    libc.close(fd)
    stat = buf.raw[:max(n, 0)].decode(errors="replace")
    return int(stat.rpartition(")")[2].split()[1])  # the field after the state


@register_defense("fork_prober")
class ForkProber(Defense):
    """Reports its descriptors and whether it could open its ancestors' memory; always fails."""

    description = "Looks for the fork server's socket and its ancestors' memory (test fixture)."

    def adapt(self, model, data, ctx):
        kinds = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue  # the listing's own descriptor, closed already
            kinds[int(name)] = target.split(":")[0] if ":[" in target or target.startswith("anon_inode:") else "file"
        sockets = sorted(fd for fd, kind in kinds.items() if kind == "socket")
        parent = os.getppid()
        grandparent = _parent_of(parent)
        raise RuntimeError(f"probe: descriptors {' '.join(f'{fd}={kinds[fd]}' for fd in sorted(kinds))}; "
                           f"sockets {sockets or 'none'}; parent mem {_libc_open(f'/proc/{parent}/mem')}; "
                           f"grandparent mem {_libc_open(f'/proc/{grandparent}/mem')}")
