"""Start a submission's plugin workers by forking one preloaded interpreter instead of starting Python each time.

A plugin worker (bench/plugin_worker.py) spends most of its start importing torch and transformers (8 to 10 s on
a 2-core CPU) and a submission starts one per call of the plugin's code. So the submission child starts one
server, ``python -m bench.fork_server FD``: a fresh interpreter that imports the trusted libraries once
(:func:`bench.sandbox.preload_trusted`) and then forks a worker per request. What the spawned worker had, the
forked one keeps:

* **no draw, no labels**: the server is a new program, started with the workers' environment (the child's, with
  nothing that points into its sandbox), not a fork of the child; the child's secrets reach it by no path;
* **only its own descriptors**: the child sends the worker's pipes, its stderr and the guard's report with the
  request (``SCM_RIGHTS``); the worker closes every other descriptor, the server's socket included, before any
  plugin code runs, so it can neither ask for workers nor read another's requests;
* **its own namespaces**: it enters a new user namespace (and mount namespace, when confined) with ``unshare(2)``
  as ``unshare --user [--mount] --map-root-user`` did, then runs :func:`bench.plugin_worker.main`, which confines
  it and arms its guard exactly as before;
* **no state from one call to the next**: each worker starts from the server's memory as the imports left it.
  The server is non-dumpable, so a worker, holding no capability in the server's user namespace, can neither
  ``ptrace`` it nor read or write its memory.

Two things a fresh interpreter had that a fork does not: paths libraries fixed at import from ``HOME`` (the
Hugging Face cache) point at the server's empty home rather than the worker's, and NumPy's global generator would
repeat from worker to worker, so it is reseeded from the OS in each (Python's ``random`` reseeds itself at fork).

CUDA does not survive a fork of a process that initialised it, and importing the libraries may; on a machine with
a CUDA device the child spawns fresh workers instead (:func:`fork_server_usable`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
_MAX_MESSAGE = 1 << 20
_FDS_PER_WORKER = 4  # its requests (read end), its replies (write end), its stderr, the guard's report


def worker_start() -> str:
    """``PRIVBENCH_WORKER_START``, checked: ``fork-server`` (the default) or ``spawn``; a
    :class:`~bench.errors.ConfigError` naming both otherwise (``privbench submit`` checks it before its sandbox)."""
    mode = os.environ.get("PRIVBENCH_WORKER_START", "fork-server")
    if mode not in ("fork-server", "spawn"):
        from bench.errors import ConfigError
        raise ConfigError(f"PRIVBENCH_WORKER_START={mode!r}: give 'fork-server' (the default) or 'spawn'")
    return mode


def fork_server_usable() -> bool:
    """Whether the submission child should fork its workers from a server: on Linux (``unshare(2)``, sequenced
    packets over a socket pair), not where CUDA is (a forked child cannot use a CUDA context its parent may have
    made), and not where ``PRIVBENCH_WORKER_START=spawn`` asks for a fresh interpreter per worker (the way to
    compare the two)."""
    if worker_start() == "spawn" or not sys.platform.startswith("linux"):
        return False
    import torch
    return not torch.cuda.is_available()


class ForkServer:
    """The child's end: starts the server, asks it for workers, learns how they ended."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._stderr = open(directory / "server.stderr", "wb")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.fork_server", str(theirs.fileno())],
                                         cwd=directory, env=env, stdin=subprocess.DEVNULL, stdout=self._stderr,
                                         stderr=self._stderr, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.sock = ours
        self._next_id = 0
        self._pids: dict[int, int] = {}       # request id -> worker pid, once the server forked it
        self._exits: dict[int, int] = {}      # worker pid -> exit status (negative: the signal)
        self._failed: dict[int, str] = {}     # request id -> why the server could not fork it
        self._gone: str | None = None         # why the server is no longer there

    def spawn(self, workdir: Path, env: dict[str, str], fds: tuple[int, int, int, int], *, nested: bool,
              mount: bool) -> ForkedWorker:
        """Ask for a worker in ``workdir`` with stdin, stdout, stderr and report descriptors ``fds`` (the
        caller closes its copies after). Returns at once: the server may still be importing."""
        self._next_id += 1
        body = json.dumps({"id": self._next_id, "workdir": str(workdir), "env": env, "nested": nested,
                           "mount": mount}).encode()
        try:
            socket.send_fds(self.sock, [body], list(fds))
        except OSError as exc:  # the server is gone; the worker's wait says so
            self._gone = self._gone or f"the worker server could not be reached ({exc})"
        return ForkedWorker(self, self._next_id)

    def pid(self, request: int) -> int:
        while request not in self._pids:
            if request in self._failed:
                raise _gone(f"the worker server could not start a worker: {self._failed[request]}")
            self._receive(None)
        return self._pids[request]

    def exit_status(self, request: int, timeout: float | None) -> int | None:
        """The worker's exit status; None if it has not ended (or not been forked yet) after ``timeout`` seconds
        (0: do not wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if request in self._failed:
                raise _gone(f"the worker server could not start a worker: {self._failed[request]}")
            pid = self._pids.get(request)
            if pid is not None and pid in self._exits:
                return self._exits[pid]
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                while self._receive(0):  # what has arrived already, without waiting
                    pass
                pid = self._pids.get(request)
                return self._exits.get(pid) if pid is not None else None
            self._receive(left)

    def _receive(self, timeout: float | None) -> bool:
        """Take one message from the server, waiting at most ``timeout`` seconds; False if none came."""
        if self._gone is not None:
            raise _gone(self._gone)
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(_MAX_MESSAGE)
        except (TimeoutError, socket.timeout, BlockingIOError):  # nothing within the timeout (or, at 0, yet)
            return False
        except OSError as exc:
            data, err = b"", exc
        else:
            err = None
        if not data:
            status = self.proc.poll()
            said = self._last_words() if status is not None and status > 0 else ""  # a traceback's last line
            self._gone = (f"the worker server ended (status {status}{said})" if status is not None
                          else f"the worker server closed its socket ({err})")
            raise _gone(self._gone)
        msg = json.loads(data)
        if "exit" in msg:
            self._exits[int(msg["exit"])] = int(msg["status"])
        elif "pid" in msg:
            self._pids[int(msg["id"])] = int(msg["pid"])
        elif "error" in msg:
            self._failed[int(msg["id"])] = str(msg["error"])
        return True

    def _last_words(self) -> str:
        self._stderr.flush()
        lines = [ln for ln in Path(self._stderr.name).read_text(errors="replace").splitlines() if ln.strip()]
        return f": {lines[-1][-300:]}" if lines else ""

    def close(self) -> None:
        """End the server (it ends by itself when its socket closes; its workers have their own pipes, and end when
        their sessions close them)."""
        self._gone = self._gone or "the worker server was closed"
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def _gone(why: str) -> Exception:
    from bench.errors import PluginError
    return PluginError(f"the plugin's worker cannot be followed: {why} (a plugin may have killed it)")


class ForkedWorker:
    """What :class:`bench.plugin_worker.WorkerSession` needs of a ``subprocess.Popen``, for a forked worker."""

    def __init__(self, server: ForkServer, request: int) -> None:
        self._server, self._request = server, request
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None

    @property
    def pid(self) -> int:
        return self._server.pid(self._request)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self._request, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self._request, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"worker {self._request}", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ----------------------------------------------------------------------------------------------- in the server

def _send(sock: socket.socket, msg: dict) -> None:
    sock.send(json.dumps(msg).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


def _enter_namespaces(mount: bool) -> None:
    """A new user namespace (and mount namespace) in which this process is root, as ``unshare --user [--mount]
    --map-root-user`` makes one: the same uid and gid outside, no supplementary groups."""
    import ctypes
    uid, gid = os.geteuid(), os.getegid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | (CLONE_NEWNS if mount else 0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWUSER{'|CLONE_NEWNS' if mount else ''}): {os.strerror(err)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _become_worker(req: dict, fds: list[int]) -> int:
    """In the forked child: the worker's descriptors and namespaces, then the worker itself."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    stdin, stdout, stderr, report = fds
    os.dup2(stdin, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    # the report keeps its number (3 or more: 0-2 were open when it arrived); everything else above 2 is closed
    os.closerange(3, report)
    os.closerange(report + 1, os.sysconf("SC_OPEN_MAX"))
    from bench.plugin_worker import make_dumpable
    make_dumpable()  # as a fresh process is: /proc/self/uid_map is then its own to write
    if req["nested"]:
        try:
            _enter_namespaces(bool(req["mount"]))
        except OSError as exc:
            sys.stderr.write(f"privbench worker: could not enter a user namespace of its own: {exc}\n")
            return 1
    started_in = os.getcwd()
    os.chdir(req["workdir"])
    # `python -m` put the server's directory first on the import path, where a spawned worker had its own (which
    # the worker cannot see once confined): the import system would list it
    sys.path[:] = [req["workdir"] if entry in (started_in, "") else entry for entry in sys.path]
    sys.path_importer_cache.pop(started_in, None)
    os.environ.clear()
    os.environ.update(req["env"])
    import tempfile
    tempfile.tempdir = None  # gettempdir() cached the server's TMPDIR
    import numpy as np
    np.random.seed()
    sys.argv = ["bench.plugin_worker", req["workdir"]]
    from bench.plugin_worker import main
    code = main(req["workdir"], report_fd=report)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _fork_worker(sock: socket.socket, req: dict, fds: list[int]) -> None:
    if len(fds) != _FDS_PER_WORKER:
        for fd in fds:
            os.close(fd)
        _send(sock, {"id": req.get("id"), "error": f"{len(fds)} descriptors sent, {_FDS_PER_WORKER} needed"})
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:  # out of processes or memory: this request fails, the server goes on
        for fd in fds:
            os.close(fd)
        _send(sock, {"id": req["id"], "error": f"fork: {exc}"})
        return
    if pid == 0:
        code = 1
        try:
            code = _become_worker(req, fds)
        except BaseException:  # noqa: BLE001 - whatever happens, the forked child never returns into the server
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    _send(sock, {"id": req["id"], "pid": pid})


def serve(fd: int) -> int:
    """The server: non-dumpable, trusted imports, then one fork per request until the child closes the socket."""
    from bench.plugin_worker import make_non_dumpable
    make_non_dumpable()
    sock = socket.socket(fileno=fd)
    from bench.sandbox import preload_trusted
    preload_trusted()
    import importlib
    import platform
    for module in ("bench.confine", "bench.plugin_ref", "bench.plugin_worker", "bench.registry"):
        importlib.import_module(module)  # what the worker imports before its guard, imported once here
    platform.processor()  # the worker's hardware description runs `uname` once; cached for every fork
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            _reap(sock)
        if sock in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _FDS_PER_WORKER + 1)
            except OSError:
                return 0
            if not data:
                return 0  # the child closed its end: its workers keep their own pipes and end with them
            _fork_worker(sock, json.loads(data), fds)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        raise SystemExit("error: usage: python -m bench.fork_server FD (started by `privbench submit`)")
    sys.exit(serve(int(sys.argv[1])))
