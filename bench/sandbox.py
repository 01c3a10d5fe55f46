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
  ``os.fork``) and any write, delete, rename or mkdir outside the sandbox dir and
  the artifact cache. A refused call is recorded in a report file and ends the
  child at once (``os._exit``), so a plugin that catches the exception cannot
  carry on. The hook is a tripwire for honest-but-buggy or careless code, not a
  security boundary against code written to escape (``ctypes`` can bypass it);
  results of runs outside CI are therefore marked unverified in the store.

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


def _set_limits(limits: Limits) -> None:
    """Runs in the child between fork and exec: a new process group, then the resource limits."""
    mem = int(limits.memory_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = limits.cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_sandboxed(argv: list[str], *, sandbox: Path, limits: Limits, env: dict[str, str] | None = None,
                  violation_file: Path | None = None, stdin_data: bytes | None = None) -> SandboxResult:
    """Run ``argv`` (a Python child that calls :func:`install_guard`) in ``sandbox`` under ``limits``.

    The child gets its own session (process group), HOME and TMPDIR inside the sandbox, no network namespace
    where the OS allows it, and is killed with its whole group when the wall-clock limit passes. ``stdin_data``
    (small: it must fit the pipe buffer) reaches the child on its standard input and nowhere on disk or in its
    environment, for a secret the child's trusted code reads before the plugin is imported.
    """
    sandbox.mkdir(parents=True, exist_ok=True)
    for sub in ("home", "tmp"):
        (sandbox / sub).mkdir(exist_ok=True)
    child_env = dict(env if env is not None else os.environ)
    child_env.update(HOME=str(sandbox / "home"), TMPDIR=str(sandbox / "tmp"), PYTHONDONTWRITEBYTECODE="1",
                     HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                     PYTHONUNBUFFERED="1")
    isolated = os_isolation_available()
    cmd = (["unshare", "--net", "--map-root-user"] if isolated else []) + list(argv)
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
        try:
            rc = proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.wait()
        else:
            _kill_group(proc)  # leftovers a plugin may have started in the group
    violation = None
    if violation_file is not None and violation_file.is_file():
        try:
            violation = json.loads(violation_file.read_text() or "null")
        except (json.JSONDecodeError, OSError):
            violation = {"message": "the sandbox report was unreadable (the plugin tampered with it)"}
    return SandboxResult(rc, time.perf_counter() - t0, timed_out, out_path.read_text(errors="replace"),
                         err_path.read_text(errors="replace"),
                         "unshare --net" if isolated else "audit hook only", violation, limits)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------------------------------- in the child

def install_guard(allowed_dirs: list[str | Path], report_path: str | Path) -> None:
    """Install the audit hook that refuses network, process creation and writes outside ``allowed_dirs``.

    Call it in the child after trusted imports and before importing the plugin. A refused event writes
    ``{"event", "message"}`` to ``report_path`` (opened now, before the hook exists) and exits the child with
    :data:`VIOLATION_EXIT`.
    """
    roots = tuple(os.path.realpath(os.fspath(d)) for d in allowed_dirs) + ("/dev/null",)
    report_fd = os.open(os.fspath(report_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.dont_write_bytecode = True
    busy = [False]  # realpath itself raises no audit events, but never recurse

    def inside(path: Any) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor: its open was checked
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            return True
        real = os.path.realpath(path)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)

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
            target = args[1] if event in ("socket.connect", "socket.bind", "socket.sendto") and len(args) > 1 \
                else args[0] if args else ""
            refuse(event, f"network access refused ({event} {target!r}): plugins run without network; "
                          f"ship data with the plugin or load it from the task")
        elif event in PROCESS_EVENTS:
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
                                  f"write only under the working directory or the artifact cache")
        elif event in PATH_EVENTS:
            busy[0] = True
            try:
                bad = [args[i] for i in PATH_EVENTS[event] if i < len(args) and not inside(args[i])]
            finally:
                busy[0] = False
            if bad:
                refuse(event, f"filesystem change outside the sandbox refused ({event} {bad[0]!r}): "
                              f"write only under the working directory or the artifact cache")

    sys.addaudithook(hook)


#: imported before the guard is armed: trusted, and some probe the network or run programs on import
TRUSTED_PRELOAD = ("torch", "transformers", "urllib3", "requests", "accelerate", "peft", "opacus", "sklearn.metrics",
                   "scipy.stats", "transformers.integrations.accelerate", "transformers.modeling_utils",
                   "transformers.trainer_utils", "transformers.models.llama.modeling_llama",
                   "transformers.models.gpt_neox.modeling_gpt_neox", "transformers.models.gpt2.modeling_gpt2",
                   "tokenizers", "bench.runner", "bench.metrics", "bench.training")


def arm_sandbox(box: Path, cache: str, violation_path: Path) -> dict:
    """In a submission child, before the plugin is imported: trusted imports, registries loaded, hardware read
    (``platform.processor()`` runs ``uname``), then the guard armed for ``box`` and the artifact cache.

    Returns the hardware description, read while that was still allowed."""
    import importlib
    for mod in TRUSTED_PRELOAD:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    from bench.registry import REGISTRIES
    from bench.runner import hardware_info
    for reg in REGISTRIES.values():
        reg.names()
    hardware = hardware_info()
    install_guard([box, cache], violation_path)
    return hardware
