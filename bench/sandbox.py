"""Run untrusted plugin code in a child process with limits, no network and a confined working directory.

Two layers, because neither is enough alone in every container:

* **OS isolation** where the kernel allows it: the child starts under
  ``unshare --net --map-root-user`` (a new, empty network namespace, so no
  connection can leave the process whatever the code does). Probed once per
  process (:func:`os_isolation_available`); skipped where user namespaces are off.
* **An audit hook** (PEP 578, ``sys.addaudithook``) installed in the child
  *before the plugin is imported* (:func:`install_guard`). It refuses network
  calls (``socket.connect/bind/getaddrinfo/...``), process creation
  (``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.posix_spawn``,
  ``os.fork``) and any write, delete, rename or mkdir outside the sandbox dir
  (which holds the child's private cache overlay, :class:`bench.cache.OverlayCache`:
  the shared artifact cache is read-only to the child). A refused call is
  recorded in a report file and ends the child at once (``os._exit``), so a
  plugin that catches the exception cannot carry on. The hook is a tripwire for
  honest-but-buggy or careless code, not a security boundary against code
  written to escape (``ctypes`` can bypass it); results of runs outside CI are
  therefore marked unverified in the store.

**Read-only paths** (``run_sandboxed(read_only=...)``: the shared artifact cache)
are also made read-only by the kernel where it allows mount namespaces
(:func:`readonly_mounts_available`): a bind mount remounted read-only in the
child's own mount namespace, locked by a second, nested user namespace so that
the child, root only inside its namespaces, can neither remount it writable nor
unmount it. Where that is not available (no user namespaces, no ``mount``
binary, macOS), only the audit hook keeps the child from writing there, and code
that bypasses the hook could alter the shared cache.

Limits are set in the child before it executes anything: ``RLIMIT_AS`` (address
space) and ``RLIMIT_CPU`` (CPU seconds); a wall-clock timeout in the parent
kills the child's whole process group.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

VIOLATION_EXIT = 86   # the child broke the sandbox (network, process creation, a write outside)
FAILURE_EXIT = 87     # the child ran but the plugin (or its run) failed; details in the result file
MEMORY_EXIT = 88      # the child ran out of its address-space limit

NETWORK_EVENTS = frozenset({"socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
                            "socket.sendmsg", "socket.gethostbyname", "socket.gethostbyaddr",
                            "socket.getnameinfo"})
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                            "os.fork", "os.forkpty", "os.startfile", "pty.spawn"})
# events whose path arguments (by position) are written, removed or created
PATH_EVENTS: dict[str, tuple[int, ...]] = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "shutil.rmtree": (0,),
    "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "os.symlink": (0, 1),
    "os.link": (0, 1), "os.mkfifo": (0,), "os.mknod": (0,), "shutil.move": (0, 1), "os.setxattr": (0,),
    "os.removexattr": (0,),
}
WRITE_HINT = ("write only under the working directory (the artifact cache is read-only: new artifacts go to the "
              "sandbox's cache overlay)")
WORKER_WRITE_HINT = ("a defense's worker writes only in its own working directory; its model goes back to privbench "
                     "through adapt's return value")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed child. CPU seconds default to twice the wall time (PyTorch threads)."""

    wall_s: float = 3600.0
    memory_bytes: int = 16 << 30
    cpu_s: int | None = None

    @property
    def cpu_seconds(self) -> int:
        return int(self.cpu_s if self.cpu_s is not None else max(1, 2 * self.wall_s))

    def describe(self) -> str:
        return f"{self.wall_s:g} s wall, {self.cpu_seconds} s CPU, {self.memory_bytes / (1 << 30):.3g} GiB memory"


@dataclass
class SandboxResult:
    """How a sandboxed child ended."""

    returncode: int
    seconds: float
    timed_out: bool
    stdout: str
    stderr: str
    isolation: str                       # "unshare --net" or "audit hook only"
    violation: dict[str, Any] | None = None
    limits: Limits = field(default_factory=Limits)

    def failure(self) -> str | None:
        """One line naming what went wrong and what to do, or None if the child exited 0."""
        if self.violation:
            return f"sandbox violation: {self.violation.get('message')}"
        if self.timed_out:
            return (f"wall-clock limit exceeded: the plugin ran longer than {self.limits.wall_s:g} s and was killed "
                    f"(an endless loop, or raise --timeout)")
        rc = self.returncode
        if rc == 0:
            return None
        if rc == MEMORY_EXIT:
            return (f"memory limit exceeded: the plugin allocated more than "
                    f"{self.limits.memory_bytes / (1 << 30):.3g} GiB (RLIMIT_AS); reduce its memory or raise --memory")
        if rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.Signals.__members__.values() else str(-rc)
            if -rc == signal.SIGXCPU:
                return (f"CPU time limit exceeded ({self.limits.cpu_seconds} s, RLIMIT_CPU): the plugin was killed; "
                        f"make it cheaper or raise --timeout")
            if -rc in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
                hint = " (often the memory limit: a native allocation failed)" if -rc != signal.SIGKILL else ""
                return f"the plugin process died from signal {sig}{hint}: {_tail(self.stderr)}"
            return f"the plugin process died from signal {sig}: {_tail(self.stderr)}"
        if rc == FAILURE_EXIT:
            return None  # the child wrote its own error; the caller reads it from the result file
        if rc == MOUNT_FAILED_EXIT and "mount" in self.stderr:
            return f"the sandbox could not make the artifact cache read-only: {_tail(self.stderr)}"
        return f"the plugin process exited with status {rc}: {_tail(self.stderr)}"


def _tail(text: str, n: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output")[-n:]


@lru_cache(maxsize=1)
def os_isolation_available() -> bool:
    """Whether ``unshare --net --map-root-user`` works here (user namespaces enabled, binary present)."""
    if os.environ.get("PRIVBENCH_NO_UNSHARE") == "1":
        return False
    try:
        proc = subprocess.run(["unshare", "--net", "--map-root-user", sys.executable, "-c", "pass"],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


# Runs as root of the child's first user namespace, with its own mount namespace (unshare --mount makes
# propagation private, so nothing leaks to the host): each path before "--" is bind-mounted onto itself and
# remounted read-only; then a nested user + mount namespace is entered, in which those mounts are locked (a mount
# inherited from a more privileged user namespace keeps its read-only flag and cannot be unmounted), and the
# command is exec'd there. Exits 97 when a mount fails.
_READ_ONLY_SCRIPT = ('while [ "$1" != -- ]; do mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 97; '
                     'shift; done; shift; exec unshare --user --mount --map-root-user -- "$@"')
MOUNT_FAILED_EXIT = 97
WAIT_POLL_S = 5.0  # how often run_sandboxed calls on_wait while the child runs


def _wrap(argv: list[str], read_only: list[str], isolated: bool, mounts: bool) -> list[str]:
    if not isolated:
        return list(argv)
    if not (read_only and mounts):
        return ["unshare", "--net", "--map-root-user"] + list(argv)
    return (["unshare", "--net", "--mount", "--map-root-user", "--", "sh", "-c", _READ_ONLY_SCRIPT,
             "privbench-sandbox"] + list(read_only) + ["--"] + list(argv))


@lru_cache(maxsize=1)
def readonly_mounts_available() -> bool:
    """Whether :func:`run_sandboxed` can make paths read-only with a locked bind mount here: probed once by
    writing into a read-only-mounted scratch directory (which must fail with EROFS and leave nothing)."""
    if os.environ.get("PRIVBENCH_NO_RO_MOUNT") == "1" or not os_isolation_available():
        return False
    import tempfile
    with tempfile.TemporaryDirectory(prefix="privbench-ro-probe-") as d:
        code = ("import errno, os, sys\n"
                "try:\n    open(os.path.join(sys.argv[1], 'w'), 'w')\n"
                "except OSError as e:\n    print('refused' if e.errno == errno.EROFS else 'other')\n"
                "else:\n    print('written')")
        try:
            proc = subprocess.run(_wrap([sys.executable, "-c", code, d], [d], True, True), capture_output=True,
                                  text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return proc.returncode == 0 and proc.stdout.strip() == "refused" and not os.listdir(d)


def check_limits(limits: Limits) -> Limits:
    """``limits`` refused (a :class:`~bench.errors.ConfigError`) when ``setrlimit`` could not apply them in the
    child: past this process's hard limits or the kernel's largest value. Found here, before any database or
    sandbox is made, not as a failed ``preexec_fn`` after."""
    from bench.errors import ConfigError

    def hard(kind: int) -> int:
        value = resource.getrlimit(kind)[1]
        return _RLIM_MAX if value == resource.RLIM_INFINITY else min(value, _RLIM_MAX)

    mem_max, cpu_max = hard(resource.RLIMIT_AS), hard(resource.RLIMIT_CPU) - 5  # _set_limits adds 5 s of grace
    if limits.memory_bytes > mem_max:
        raise ConfigError(f"--memory {limits.memory_bytes / (1 << 30):g} GiB is more than a process may be given "
                          f"here: give at most {mem_max / (1 << 30):.0f} GiB (e.g. --memory 16)")
    if limits.cpu_seconds > cpu_max:
        raise ConfigError(f"--timeout {limits.wall_s:g} s (CPU limit {limits.cpu_seconds} s) is more than a process "
                          f"may be given here: give at most {cpu_max // 2} s (e.g. --timeout 3600)")
    return limits


#: the largest resource limit the kernel takes that is not "unlimited" (rlim_t is 64 bits; RLIM_INFINITY is all ones)
_RLIM_MAX = (1 << 63) - 1


def _set_limits(limits: Limits) -> None:
    """Runs in the child between fork and exec: a new process group, then the resource limits."""
    mem = int(limits.memory_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = limits.cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def check_apart(sandbox: str | Path, read_only: Sequence[str | Path]) -> None:
    """Refuse a sandbox directory inside a read-only one (the child could not write its own files) or containing
    one (the guard would let the child write there): a :class:`~bench.errors.ConfigError` naming both."""
    from bench.errors import ConfigError
    box = os.path.realpath(os.fspath(sandbox))
    for p in read_only:
        r = os.path.realpath(os.fspath(p))
        if box == r or box.startswith(r.rstrip("/") + "/") or r.startswith(box.rstrip("/") + "/"):
            raise ConfigError(f"the sandbox directory {box} and the artifact cache {r} must not contain each other: "
                              f"give a sandbox directory outside the cache (or a cache outside the sandbox)")


def run_sandboxed(argv: list[str], *, sandbox: Path, limits: Limits, env: dict[str, str] | None = None,
                  violation_file: Path | None = None, stdin_data: bytes | None = None,
                  read_only: Sequence[str | Path] = (), on_wait: Callable[[], None] | None = None) -> SandboxResult:
    """Run ``argv`` (a Python child that calls :func:`install_guard`) in ``sandbox`` under ``limits``.

    The child gets its own session (process group), HOME and TMPDIR inside the sandbox, no network namespace
    where the OS allows it, and is killed with its whole group when the wall-clock limit passes. ``stdin_data``
    (small: it must fit the pipe buffer) reaches the child on its standard input and nowhere on disk or in its
    environment, for a secret the child's trusted code reads before the plugin is imported. ``read_only``
    directories (existing, outside ``sandbox``) are read-only to the child where the kernel allows it
    (:func:`readonly_mounts_available`); elsewhere only the child's audit hook protects them. ``on_wait`` is
    called every few seconds while the child runs, and once after it ends (to relay its progress).
    """
    sandbox.mkdir(parents=True, exist_ok=True)
    for sub in ("home", "tmp"):
        (sandbox / sub).mkdir(exist_ok=True)
    child_env = dict(env if env is not None else os.environ)
    child_env.update(HOME=str(sandbox / "home"), TMPDIR=str(sandbox / "tmp"), PYTHONDONTWRITEBYTECODE="1",
                     HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                     PYTHONUNBUFFERED="1")
    check_apart(sandbox, read_only)
    isolated = os_isolation_available()
    ro = [os.path.realpath(os.fspath(p)) for p in read_only]
    mounts = bool(ro) and isolated and readonly_mounts_available()
    cmd = _wrap(list(argv), ro, isolated, mounts)
    t0 = time.perf_counter()
    out_path, err_path = sandbox / "child.stdout", sandbox / "child.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=sandbox, env=child_env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                                start_new_session=True, preexec_fn=lambda: _set_limits(limits))
        if stdin_data is not None:
            try:
                proc.stdin.write(stdin_data)
            except BrokenPipeError:  # the child died before reading: its exit status says why
                pass
            finally:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        timed_out = False
        deadline = time.monotonic() + limits.wall_s
        while True:
            try:
                rc = proc.wait(timeout=max(0.0, min(WAIT_POLL_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if on_wait is not None:
                    on_wait()
                if time.monotonic() < deadline:
                    continue
                timed_out = True
                _kill_group(proc)
                rc = proc.wait()
            else:
                _kill_group(proc)  # leftovers a plugin may have started in the group
            break
        if on_wait is not None:
            on_wait()
    violation = None
    if violation_file is not None and violation_file.is_file():
        try:
            violation = json.loads(violation_file.read_text() or "null")
        except (json.JSONDecodeError, OSError):
            violation = {"message": "the sandbox report was unreadable (the plugin tampered with it)"}
    return SandboxResult(rc, time.perf_counter() - t0, timed_out, out_path.read_text(errors="replace"),
                         err_path.read_text(errors="replace"),
                         ("unshare --net --mount, shared cache read-only" if mounts else "unshare --net")
                         if isolated else "audit hook only", violation, limits)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------------------------------- in the child

def install_guard(allowed_dirs: list[str | Path], report_path: str | Path | int, *,
                  unreadable: Sequence[str | Path] = (), other_processes: bool = True,
                  may_spawn: Callable[[tuple], bool] | None = None,
                  write_hint: str = WRITE_HINT, databases: bool = True,
                  sockets: Sequence[Any] = ()) -> None:
    """Install the audit hook that refuses network, process creation and writes outside ``allowed_dirs``.

    Call it in the child after trusted imports and before importing the plugin. A refused event writes
    ``{"event", "message"}`` to ``report_path`` (opened now, before the hook exists) and exits the child with
    :data:`VIOLATION_EXIT`. ``unreadable`` directories (outside ``allowed_dirs``) may not be opened, listed or
    connected to as databases either; ``other_processes=False`` refuses every ``/proc/<pid>`` but the process's
    own. ``may_spawn(args)`` lets trusted code start the one program it names (``subprocess.Popen`` events only).
    ``databases=False`` refuses every SQLite connection (a plugin worker's: SQLite opens and writes its files in C,
    past this hook, and ``ATTACH`` raises no event). ``report_path`` may be a descriptor already open for writing.
    ``sockets``: local sockets trusted code may send messages on (the fork server's, bench/fork_server.py, which
    carries a worker's descriptors); every other ``socket.sendmsg`` is refused with the network.
    """
    own_sockets = tuple(sockets)
    roots = tuple(os.path.realpath(os.fspath(d)) for d in allowed_dirs) + ("/dev/null",)
    hidden = tuple(os.path.realpath(os.fspath(d)) for d in unreadable)
    own_proc = f"/proc/{os.getpid()}"
    report_fd = report_path if isinstance(report_path, int) else \
        os.open(os.fspath(report_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.dont_write_bytecode = True
    busy = [False]  # realpath itself raises no audit events, but never recurse

    def as_text(path: Any) -> str | None:
        """A path argument as text; None for an already-open descriptor (its open was checked) or anything else."""
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        return path if isinstance(path, str) else None

    def under(real: str, dirs: tuple[str, ...]) -> bool:
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in dirs)

    def inside(path: Any) -> bool:
        text = as_text(path)
        return text is None or under(os.path.realpath(text), roots)

    def hidden_path(path: Any) -> str | None:
        """The path if reading it is refused (a hidden directory, or another process's /proc entry), else None."""
        path = as_text(path)
        if path is None:
            return None
        real = os.path.realpath(path)
        if under(real, roots):
            return None
        if under(real, hidden):
            return path
        if not other_processes:
            parts = real.split("/")
            if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and not under(real, (own_proc,)):
                return path
        return None

    def refuse(event: str, message: str) -> None:
        body = json.dumps({"event": event, "message": message}).encode()
        try:
            os.write(report_fd, body)
            os.fsync(report_fd)
        finally:
            import traceback
            sys.stderr.write("".join(traceback.format_stack()[:-2]))
            sys.stderr.write(f"privbench sandbox: {message}\n")
            sys.stderr.flush()
            os._exit(VIOLATION_EXIT)

    def hook(event: str, args: tuple) -> None:
        if busy[0]:
            return
        if event in NETWORK_EVENTS:
            if event == "socket.sendmsg" and args and any(args[0] is sock for sock in own_sockets):
                return
            target = args[1] if event in ("socket.connect", "socket.bind", "socket.sendto") and len(args) > 1 \
                else args[0] if args else ""
            refuse(event, f"network access refused ({event} {target!r}): plugins run without network; "
                          f"ship data with the plugin or load it from the task")
        elif event in PROCESS_EVENTS:
            if may_spawn is not None and event == "subprocess.Popen" and may_spawn(tuple(args)):
                return
            what = args[0] if args else ""
            refuse(event, f"process creation refused ({event} {what!r}): plugins may not start programs; "
                          f"do the work in Python inside the plugin")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                     (mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes:
                busy[0] = True
                try:
                    ok = inside(path)
                finally:
                    busy[0] = False
                if not ok:
                    refuse(event, f"write outside the sandbox refused (open {path!r} mode {mode or flags!r}): "
                                  f"{write_hint}")
            elif hidden or not other_processes:
                busy[0] = True
                try:
                    bad = hidden_path(path)
                finally:
                    busy[0] = False
                if bad is not None:
                    refuse(event, f"read of the runner's files refused (open {bad!r}): a plugin reads only what "
                                  f"its contract hands it and its own working directory")
        elif not databases and event in ("sqlite3.connect", "sqlite3.enable_load_extension"):
            refuse(event, f"database access refused ({event} {args[0] if args else ''!r}): a plugin's worker opens no "
                          f"SQLite database (privbench's store and caches are not the plugin's); keep state in memory "
                          f"or in plain files in its working directory")
        elif event in ("os.listdir", "os.scandir", "sqlite3.connect") and (hidden or not other_processes):
            busy[0] = True
            try:
                bad = hidden_path(args[0] if args else None)
            finally:
                busy[0] = False
            if bad is not None:
                refuse(event, f"read of the runner's files refused ({event} {bad!r}): a plugin reads only what "
                              f"its contract hands it and its own working directory")
        elif event in PATH_EVENTS:
            busy[0] = True
            try:
                bad = [args[i] for i in PATH_EVENTS[event] if i < len(args) and not inside(args[i])]
            finally:
                busy[0] = False
            if bad:
                refuse(event, f"filesystem change outside the sandbox refused ({event} {bad[0]!r}): "
                              f"{write_hint}")

    sys.addaudithook(hook)


#: imported before the guard is armed: trusted, and some probe the network or run programs on import
TRUSTED_PRELOAD = ("torch", "transformers", "urllib3", "requests", "accelerate", "peft", "opacus", "sklearn.metrics",
                   "scipy.stats", "transformers.integrations.accelerate", "transformers.modeling_utils",
                   "transformers.trainer_utils", "transformers.models.llama.modeling_llama",
                   "transformers.models.gpt_neox.modeling_gpt_neox", "transformers.models.gpt2.modeling_gpt2",
                   "tokenizers", "bench.runner", "bench.metrics", "bench.training")


def preload_trusted() -> None:
    """Import :data:`TRUSTED_PRELOAD` (what is missing is skipped): library code the guard would otherwise see
    opening files once a plugin runs. It loads no registry, so no installed plugin is imported."""
    import importlib
    for mod in TRUSTED_PRELOAD:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass


def arm_sandbox(box: Path, violation_path: Path | int, **guard: Any) -> dict:
    """In a submission child, before the plugin is imported: trusted imports, registries loaded, hardware read
    (``platform.processor()`` runs ``uname``), then the guard armed for ``box`` alone: the child's cache overlay
    is inside it, and the shared artifact cache is read-only (:class:`bench.cache.OverlayCache`). ``guard`` goes
    to :func:`install_guard` (a plugin worker's unreadable directories, the child's worker command).

    Returns the hardware description, read while that was still allowed."""
    preload_trusted()
    from bench.registry import REGISTRIES
    from bench.runner import hardware_info
    for reg in REGISTRIES.values():
        reg.names()
    hardware = hardware_info()
    install_guard([box], violation_path, **guard)
    return hardware
