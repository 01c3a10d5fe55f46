"""A submitted plugin runs in worker processes of its own, apart from the runner that holds the labels.

`privbench submit` scores a plugin in a sandboxed child (bench/submit.py) whose runner holds every world's draw:
the challenger, its groups and, once evaluations run, the labels. Code in that process could read them
(``gc.get_objects`` finds the challenger and the game instances): a defense could leave the membership targets
out of training, an attack could return the labels as scores. So the child never imports a submitted plugin. It
registers a stand-in under the plugin's name (:func:`worker_defense`, :func:`worker_attack`), and every call into
the plugin's code runs in a fresh worker, forked from the submission's preloaded server (bench/fork_server.py) or
started as ``python -m bench.plugin_worker DIR`` (``PRIVBENCH_WORKER_START=spawn``, and where CUDA is), which gets
only what the contract gives the plugin:

* a defense's ``adapt``: θ as a checkpoint directory, the :class:`~bench.game.AdaptationData` and the training
  settings (``pretrain_texts``: the documents; ``pretrain_loss_mask``: the token ids); θ' comes back as a
  safetensors checkpoint;
* an attack's ``score``: the attacker view as data (targets, population, public format) with the released
  models, shadows and trainer as handles; each model call comes back to the child and runs on the same
  :class:`~bench.lm.RestrictedModel` a bundled attack would get, so capabilities are enforced there.

What keeps the labels from a worker:

* **no draw in it**: the worker is a new interpreter, or a fork of one (the fork server) that never held the
  draw, not a fork of the child; the draw secret reaches the child on its standard input and is never in the
  environment or on disk;
* **no labels on disk while it runs**: a submission keeps evaluation rows in memory until the last game is
  scored (``SubmissionRunner`` in bench/submit.py);
* **no way into the child's memory**: the child makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so
  ``/proc/<pid>/mem`` and ``ptrace`` need a capability over it, and where user namespaces exist each worker
  starts in a nested one (``unshare --user``), where it holds no capability over the child's;
* **a tripwire**: the worker's audit hook (bench/sandbox.py) refuses writes outside its own directory, any
  Python-level read of the child's sandbox (scratch database, cache overlay) and of other processes' ``/proc``
  entries, the network and starting programs.

The worker answers in JSON lines on a descriptor of its own (the plugin's prints go to its stderr): nothing the
plugin writes is unpickled or executed by the child. A worker is started per call, from the server's untouched
memory when forked, so a plugin keeps no state from one world or game to the next.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.defense import Adapted, Defense, Filtered, TrainContext
from bench.errors import CapabilityError, ConfigError, PluginError, PrivbenchError
from bench.plugin_ref import PluginRef

WORKERS_DIR = "workers"
WORKER_ARGV = (sys.executable, "-m", "bench.plugin_worker")


class WorkerViolation(BaseException):
    """A worker broke the sandbox: the child ends at once with the worker's status (its report is written)."""


def make_non_dumpable() -> bool:
    """Refuse ``/proc/<pid>/mem`` and ``ptrace`` of this process to processes without CAP_SYS_PTRACE over it
    (Linux ``prctl(PR_SET_DUMPABLE, 0)``); False where that is not available."""
    return _set_dumpable(0)


def make_dumpable() -> bool:
    """Undo :func:`make_non_dumpable` in a process forked from one (bench/fork_server.py): a fresh process is
    dumpable, and a process writes its own ``/proc/self/uid_map`` only while it is."""
    return _set_dumpable(1)


def _set_dumpable(value: int) -> bool:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, value, 0, 0, 0) == 0  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class WorkerIsolation:
    """How the child starts its workers: in a nested user namespace (``nested``), with the kernel's file-system
    confinement (``confine``, bench/confine.py: read-only everywhere but the worker's directory), with these
    directories out of the worker's sight (``hidden``: the sandbox, the shared artifact cache), and forked from a
    preloaded interpreter (``server``, bench/fork_server.py) or, without one, each started as a new program."""

    nested: bool = False
    confine: bool = False
    hidden: tuple[str, ...] = ()
    server: Any = field(default=None, compare=False)

    @classmethod
    def probe(cls, hidden: Sequence[str | Path]) -> WorkerIsolation:
        """What this machine allows (it starts programs: call it before the child's guard is armed)."""
        from bench.confine import confinement_available
        from bench.sandbox import os_isolation_available
        nested = os_isolation_available()
        return cls(nested, nested and confinement_available(), tuple(os.fspath(h) for h in hidden))

    def describe(self) -> str:
        start = "; forked from a preloaded server" if self.server is not None else "; each a new interpreter"
        if self.confine:
            return "own user + mount namespace, read-only file system, sandbox and artifact cache hidden" + start
        return ("own user namespace, audit hook" if self.nested else "audit hook only") + start

    def prefix(self) -> list[str]:
        if self.confine:
            return list(CONFINED_PREFIX)
        return list(NESTED_PREFIX) if self.nested else []


NESTED_PREFIX = ("unshare", "--user", "--map-root-user")
CONFINED_PREFIX = ("unshare", "--user", "--mount", "--map-root-user")


def worker_argv(workdir: Path, isolation: WorkerIsolation) -> list[str]:
    return [*isolation.prefix(), *WORKER_ARGV, str(workdir)]


def spawn_allowed(box: Path):
    """For the child's audit hook: only the worker command, with a directory under ``box``'s workers."""
    root = os.path.realpath(box / WORKERS_DIR)

    def allowed(args: tuple) -> bool:
        argv = list(args[1]) if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
        for prefix in (CONFINED_PREFIX, NESTED_PREFIX):
            if tuple(argv[:len(prefix)]) == prefix:
                argv = argv[len(prefix):]
                break
        if len(argv) != len(WORKER_ARGV) + 1 or tuple(argv[:-1]) != WORKER_ARGV:
            return False
        real = os.path.realpath(str(argv[-1]))
        return real.startswith(root + "/")
    return allowed


def worker_env(box: Path, directory: Path) -> dict[str, str]:
    """A worker's environment (and its fork server's): the child's, less the draw and every variable that points
    into the sandbox (the cache overlay, the cache directories libraries set for themselves under the child's
    TMPDIR), with HOME and TMPDIR in ``directory``."""
    inside = str(box.resolve()).rstrip("/") + "/"
    env = {k: v for k, v in os.environ.items()
           if not (os.path.isabs(v) and (os.path.realpath(v) + "/").startswith(inside))}
    env.update(HOME=str(directory / "home"), TMPDIR=str(directory / "tmp"))
    env.pop("PRIVBENCH_DRAW_SECRET", None)
    return env


def _forked(isolation: WorkerIsolation, directory: Path, env: dict[str, str], stderr: int, report: int):
    """A worker forked by ``isolation.server``, with pipes made here: the server gets their far ends, and this
    side's copies of those are closed, so either side sees the other end."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        proc = isolation.server.spawn(directory, env, (in_r, out_w, stderr, report), nested=isolation.nested,
                                      mount=isolation.confine)
    except BaseException:
        for fd in (in_w, out_r):
            os.close(fd)
        raise
    finally:
        for fd in (in_r, out_w):
            os.close(fd)
    proc.stdin = os.fdopen(in_w, "wb")
    proc.stdout = os.fdopen(out_r, "rb")
    return proc


class WorkerSession:
    """One worker process in a fresh directory under ``box/workers``: requests as pickles on its stdin (the child
    is trusted), replies as JSON lines on its stdout (the worker is not)."""

    def __init__(self, plugin: PluginRef, box: Path, violation_file: Path, isolation: WorkerIsolation) -> None:
        (box / WORKERS_DIR).mkdir(exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="w-", dir=box / WORKERS_DIR))
        for sub in ("home", "tmp"):
            (self.dir / sub).mkdir()
        env = worker_env(box, self.dir)
        self._closed = False
        self._stderr = open(self.dir / "worker.stderr", "wb")
        # the worker's guard reports a refusal here; opened on this side, so that the report (in the sandbox, which
        # the worker cannot see) is no open file on the worker's own mounts, which it makes read-only
        self._report = os.open(violation_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if isolation.server is not None:
                self.proc = _forked(isolation, self.dir, env, self._stderr.fileno(), self._report)
            else:
                self.proc = subprocess.Popen(worker_argv(self.dir, isolation), cwd=self.dir, env=env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                             pass_fds=(self._report,))
        except BaseException:
            os.close(self._report)
            self._stderr.close()
            raise
        # the first request goes now and its reply is read when first needed (``info``): the caller can do its
        # own trusted imports while the worker starts Python, imports torch and loads the plugin
        self._info: dict | None = None
        self._send({"plugin": plugin.to_dict(), "unreadable": [str(box), *isolation.hidden],
                    "report_fd": self._report, "confine": isolation.confine})

    @property
    def info(self) -> dict:
        """The plugin's kind, name, version and parameters, as its worker loaded it (waits for the worker)."""
        if self._info is None:
            try:
                self._info = self._exchange(None)
            except BaseException:
                self.close()
                raise
        return self._info

    def call(self, op: str, serve=None, **args: Any) -> Any:
        """Send one request; while the worker asks for model calls (``{"call": ...}``), answer them with
        ``serve(call)`` (its value, or the exception it raised, goes back as a pickle); return the final reply."""
        self.info  # noqa: B018 - the loading reply comes first
        return self._exchange({"op": op, **args}, serve)

    def _send(self, message: Any) -> None:
        try:
            pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is gone: its status says why

    def _exchange(self, message: dict | None, serve=None) -> Any:
        if message is not None:  # None: only read the reply to what was sent before
            self._send(message)
        while True:
            reply = self._read()
            if "call" not in reply:
                break
            if serve is None:
                raise PluginError("the plugin's worker asked for a model call where none is offered")
            try:
                self._send({"value": serve(reply["call"])})
            except PrivbenchError as exc:  # e.g. an undeclared capability: raised again in the plugin
                self._send({"raise": type(exc).__name__, "message": str(exc)})
            except Exception as exc:  # noqa: BLE001 - a malformed call is the plugin's error
                self._send({"raise": "PluginError", "message": f"{type(exc).__name__}: {exc}"})
        if "error" in reply:
            if reply.get("memory"):
                raise MemoryError(str(reply["error"]))
            if reply.get("kind") == "CapabilityError":
                raise CapabilityError(str(reply["error"]))
            raise PluginError(str(reply["error"]))
        return reply.get("ok")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self._died()
        try:
            reply = json.loads(line)
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except ValueError:
            raise PluginError("the plugin's worker answered something that is not a reply: its standard output is "
                              "privbench's channel (print to stderr instead)") from None
        return reply

    def _died(self) -> None:
        from bench.sandbox import MEMORY_EXIT, VIOLATION_EXIT
        rc = self.proc.wait()  # a forked worker whose server is gone: a PluginError saying so
        self._stderr.flush()
        if rc == VIOLATION_EXIT:
            raise WorkerViolation()
        if rc == MEMORY_EXIT:
            raise MemoryError("the plugin's worker exceeded the memory limit")
        tail = (self.dir / "worker.stderr").read_text(errors="replace").strip().splitlines()
        raise PluginError(f"the plugin's worker process ended with status {rc}: {tail[-1] if tail else 'no output'}")

    def close(self) -> None:
        if self._closed:  # once: ``info`` closes a session whose worker failed, and ``with`` closes it again
            return
        self._closed = True
        try:
            if self.proc.poll() is None:
                try:
                    pickle.dump({"op": "close"}, self.proc.stdin)
                    self.proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        except PluginError:  # a forked worker whose server is gone: nothing left to wait for
            pass
        finally:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None and not pipe.closed:
                    try:
                        pipe.close()
                    except OSError:
                        pass
            self._stderr.close()
            os.close(self._report)
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> WorkerSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def worker_defense(plugin: PluginRef, info: dict, box: Path, violation_file: Path,
                   isolation: WorkerIsolation) -> type[Defense]:
    """The child's stand-in for a submitted defense: its name, version, stages and defaults as the worker
    described them; each call of its code in a fresh worker."""

    def session() -> WorkerSession:
        return WorkerSession(plugin, box, violation_file, isolation)

    class WorkerDefense(Defense):
        __doc__ = info.get("doc") or "A submitted defense, run in worker processes."
        version = str(info["version"])
        description = str(info.get("description") or "")
        stages = frozenset(info["stages"])
        uses_validation = bool(info["uses_validation"])

        def __init__(self, **params: Any) -> None:
            if params:
                raise ConfigError(f"defense '{self.name}': a submission runs the plugin with its default "
                                  f"parameters; give defaults in the plugin instead of {sorted(params)}")
            super().__init__()
            self.config = dict(info["config"])

        def adapt(self, model: torch.nn.Module, data, ctx: TrainContext) -> Adapted:
            # timed from the worker's start: the plugin's import and construction run in its handshake, and work
            # done there (a corpus rebuilt, a helper model trained and kept in a global) is part of its cost
            t0 = time.perf_counter()
            with session() as w:
                theta, released = w.dir / "theta", w.dir / "released"
                model.save_pretrained(theta)
                ctx.tokenizer.save_pretrained(theta)
                released.mkdir()
                out = w.call("adapt", model_dir=str(theta), data=data, out_dir=str(released),
                             device=str(ctx.device), max_length=ctx.max_length, seed=ctx.seed,
                             autocast_bf16=ctx.autocast_bf16)
                # timed on this side of the pipe: the plugin's process cannot set it (bench/artifacts.py)
                self.measured_adapt_seconds = time.perf_counter() - t0
                adapted = load_released(released, ctx.device)
            report, guarantee = out.get("report") or {}, out.get("guarantee")
            if not isinstance(report, dict) or not (guarantee is None or isinstance(guarantee, dict)):
                raise PluginError(f"defense '{self.name}': its report must be a dict and its guarantee a dict or "
                                  f"None")
            return Adapted(adapted, report, guarantee)

        def pretrain_texts(self, docs: list[str]) -> Filtered:
            with session() as w:
                out = w.call("pretrain_texts", docs=list(docs))
            return Filtered(list(out["docs"]), dict(out.get("report") or {}))

    if info.get("loss_mask"):
        masks: dict[str, WorkerSession] = {}

        def pretrain_loss_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
            if "w" not in masks:  # one worker for every batch; it ends at exit, or with the child's process group
                import atexit
                masks["w"] = session()
                atexit.register(masks["w"].close)
            out = masks["w"].call("loss_mask", ids=input_ids.detach().cpu().numpy())
            mask = torch.tensor(out, dtype=torch.bool, device=input_ids.device)
            if mask.shape != input_ids.shape:
                raise PluginError(f"defense '{self.name}': pretrain_loss_mask returned shape {tuple(mask.shape)} "
                                  f"for input_ids of shape {tuple(input_ids.shape)}")
            return mask

        WorkerDefense.pretrain_loss_mask = pretrain_loss_mask
    WorkerDefense.__qualname__ = WorkerDefense.__name__ = f"WorkerDefense[{info['name']}]"
    return WorkerDefense


MODEL_METHODS = frozenset({"token_signals", "next_token_logprobs", "generate", "split_at_token"})


def worker_attack(plugin: PluginRef, info: dict, box: Path, violation_file: Path,
                  isolation: WorkerIsolation) -> type:
    """The child's stand-in for a submitted attack: each game scored by a fresh worker that gets the attacker view
    (targets, population, public format) with the released models as handles whose calls come back here, to the
    same :class:`~bench.lm.RestrictedModel` the view holds; the labels never leave this process."""
    from bench.attack import Attack, Scores
    if info.get("metrics"):
        raise ConfigError(f"attack '{info['name']}' declares metric rows of its own (Attack.metrics), which read the "
                          f"labels: a submitted attack cannot yet (they would need the labels in its process); "
                          f"report per-target details in Scores and leave metrics() to privbench")

    class WorkerAttack(Attack):
        __doc__ = info.get("doc") or "A submitted attack, run in worker processes."
        version = str(info["version"])
        description = str(info.get("description") or "")
        family = str(info["family"])
        requires = frozenset(info["requires"])
        scores_units = bool(info["scores_units"])
        reference = str(info.get("reference") or "")

        def __init__(self, **params: Any) -> None:
            if params and params != info["config"]:
                raise ConfigError(f"attack '{self.name}': a submission runs the plugin with its default parameters; "
                                  f"give defaults in the plugin instead of {sorted(params)}")
            super().__init__()
            self.config = dict(info["config"])

        def score(self, view):
            handles: dict[int, Any] = {}
            spec = view_spec(view, handles)
            with WorkerSession(plugin, box, violation_file, isolation) as w:
                out = w.call("score", serve=lambda call: serve_call(call, handles), view=spec)
            return Scores(out["values"], out.get("details"))

    WorkerAttack.__qualname__ = WorkerAttack.__name__ = f"WorkerAttack[{info['name']}]"
    return WorkerAttack


def _handle(obj, handles: dict[int, Any]) -> dict | None:
    """A handle to ``obj`` for the worker, over its private-cache twin: a worker's calls neither read the runner's
    caches nor leave anything in them, so their timing carries nothing from one game's worker to the next."""
    if obj is None:
        return None
    i = len(handles)
    handles[i] = obj.with_private_cache() if hasattr(obj, "with_private_cache") else obj
    return {"id": i, "fingerprint": obj.fingerprint, "capabilities": sorted(obj.capabilities),
            "role": str(getattr(obj, "role", ""))}


def view_spec(view, handles: dict[int, Any]) -> dict:
    """The attacker view as plain data: models, shadows and the trainer become handles into ``handles``."""
    shadows = None
    if view.shadows is not None:
        sh = view.shadows
        shadows = {"models": [_handle(m, handles) for m in sh.models], "members": [list(m) for m in sh.members],
                   "held_out": list(sh.held_out), "base": sh.base}
    trainer = None
    if view.trainer is not None:
        i = len(handles)
        handles[i] = view.trainer.with_private_cache()
        trainer = {"id": i, "start": str(view.trainer.start)}
    return {"game": view.game, "targets": [(t.id, t.text, list(t.samples)) for t in view.targets],
            "model": _handle(view.model, handles), "base": _handle(view.base, handles),
            "reference": _handle(view.reference, handles),
            "population": None if view.population is None else list(view.population), "shadows": shadows,
            "public_format": view.public_format, "unit": view.unit, "trainer": trainer}


def serve_call(call: Any, handles: dict[int, Any]) -> Any:
    """One model (or trainer) call a worker asked for, checked for shape before it reaches the handle."""
    if not isinstance(call, dict) or not isinstance(call.get("id"), int) or call["id"] not in handles:
        raise PluginError("the worker named no handle it was given")
    obj, method, args = handles[call["id"]], call.get("method"), call.get("args") or []
    if not isinstance(args, list):
        raise PluginError("a model call's arguments must be a list")
    if hasattr(obj, "finetune") and method == "finetune":
        texts, epochs, lr, batch_size, seed = args
        model = obj.finetune([str(t) for t in texts], epochs=float(epochs), lr=float(lr),
                             batch_size=int(batch_size), seed=int(seed))
        return {"handle": _handle(model, handles)}
    if method not in MODEL_METHODS or hasattr(obj, "finetune"):
        raise PluginError(f"the worker asked for '{method}', which a released model does not offer")
    return getattr(obj, method)(*args)


RELEASE_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja")


def load_released(directory: Path, device: torch.device) -> torch.nn.Module:
    """θ' as the worker saved it: safetensors weights and JSON configuration only (nothing that unpickles)."""
    from transformers import AutoModelForCausalLM
    odd = sorted(p.name for p in directory.rglob("*") if p.is_file() and not p.name.endswith(RELEASE_SUFFIXES))
    if odd:
        raise PluginError(f"the submitted defense's release holds files privbench does not load ({', '.join(odd)}): "
                          f"a submission releases a safetensors checkpoint")
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True, dtype=torch.float32,
                                                     trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise PluginError(f"the submitted defense's release could not be loaded: {str(exc).splitlines()[0]}") \
            from None
    return model.to(device)


# ------------------------------------------------------------------------------------------- in the worker

def _describe(kind: str, name: str, cls: type) -> dict:
    info: dict[str, Any] = {"kind": kind.rstrip("s"), "name": name, "version": str(cls.version),
                            "description": cls.description, "doc": cls.__doc__}
    if info["kind"] == "attack":
        from bench.attack import Attack
        instance = cls()
        info.update(family=str(cls.family), requires=sorted(cls.requires), scores_units=bool(cls.scores_units),
                    reference=str(getattr(cls, "reference", "") or ""),
                    config=json.loads(json.dumps(instance.config, default=str)),
                    metrics=cls.metrics is not Attack.metrics)
    if info["kind"] == "defense":
        instance = cls()
        info.update(stages=sorted(cls.stages), uses_validation=bool(cls.uses_validation),
                    config=json.loads(json.dumps(instance.config, default=str)),
                    loss_mask=cls.pretrain_loss_mask is not Defense.pretrain_loss_mask)
    return info


def _adapt(cls: type, req: dict) -> dict:
    from bench.artifacts import with_train_seconds
    from bench.modeling import load_model
    from bench.release import Release
    device = torch.device(req["device"])
    model, tok = load_model(req["model_dir"], device=device)
    ctx = TrainContext(tok, device, int(req["max_length"]), int(req["seed"]), bool(req["autocast_bf16"]),
                       progress=False)
    torch.manual_seed(int(req["seed"]))
    defense = cls()
    t0 = time.perf_counter()
    raw = defense.adapt(model, req["data"], ctx)
    result = with_train_seconds(defense.adapted(raw), time.perf_counter() - t0)  # timed here, not with the worker
    if isinstance(result.model, Release) or not isinstance(result.model, torch.nn.Module):
        raise PluginError(f"defense '{cls.name}' released {type(result.model).__name__}: a submitted defense "
                          f"releases one model (a torch module with save_pretrained; merge adapters first)")
    result.model.save_pretrained(req["out_dir"], safe_serialization=True)
    return json.loads(json.dumps({"report": result.report, "guarantee": result.guarantee}, default=str))


def _pretrain_texts(cls: type, req: dict) -> dict:
    result = cls().pretrain_texts(list(req["docs"]))
    kept, report = (result.docs, result.report) if isinstance(result, Filtered) else (result, {})
    if not isinstance(kept, (list, tuple)) or not all(isinstance(t, str) for t in kept):
        raise PluginError(f"defense '{cls.name}': pretrain_texts returned {type(kept).__name__}, not a list of "
                          f"strings: return the documents to pretrain on")
    return json.loads(json.dumps({"docs": list(kept), "report": dict(report)}, default=str))


class _Remote:
    """The worker's end of the child's handles: each call a JSON line out, its answer a pickle back."""

    def __init__(self, channel, requests) -> None:
        self.channel, self.requests = channel, requests

    def __call__(self, handle: int, method: str, args: list) -> Any:
        self.channel.write(json.dumps({"call": {"id": handle, "method": method, "args": args}}) + "\n")
        self.channel.flush()
        answer = pickle.load(self.requests)
        if "raise" in answer:
            from bench import errors
            raise getattr(errors, answer["raise"], PluginError)(answer["message"])
        return answer["value"]


def _remote_model(spec: dict | None, rpc: _Remote):
    if spec is None:
        return None
    from bench.lm import LanguageModel

    class RemoteModel(LanguageModel):
        """A released model whose every call runs in the child, on the handle the view there holds."""

        __slots__ = ("fingerprint", "capabilities", "role")

        def __init__(self) -> None:
            self.fingerprint, self.capabilities = str(spec["fingerprint"]), frozenset(spec["capabilities"])
            self.role = str(spec["role"])

        def token_signals(self, texts, prefix=None):
            return rpc(spec["id"], "token_signals", [list(map(str, texts)), prefix])

        def next_token_logprobs(self, prefixes):
            return rpc(spec["id"], "next_token_logprobs", [list(map(str, prefixes))])

        def generate(self, prompts, max_new_tokens):
            return rpc(spec["id"], "generate", [list(map(str, prompts)), int(max_new_tokens)])

        def split_at_token(self, text, n_tokens):
            return rpc(spec["id"], "split_at_token", [str(text), int(n_tokens)])

    return RemoteModel()


def _view(spec: dict, rpc: _Remote):
    from bench.game import AttackerView, ShadowSet, Target
    shadows = None
    if spec["shadows"] is not None:
        sh = spec["shadows"]
        shadows = ShadowSet(tuple(_remote_model(m, rpc) for m in sh["models"]), tuple(tuple(m) for m in sh["members"]),
                            tuple(sh["held_out"]), sh["base"])
    trainer = None
    if spec["trainer"] is not None:
        from bench.attacker_models import ReferenceTrainer
        tid = spec["trainer"]["id"]

        def run(texts, epochs, lr, batch_size, seed):
            return _remote_model(rpc(tid, "finetune", [list(texts), epochs, lr, batch_size, seed])["handle"], rpc)
        trainer = ReferenceTrainer(spec["trainer"]["start"], run)
    targets = tuple(Target(i, text, tuple(samples)) for i, text, samples in spec["targets"])
    population = None if spec["population"] is None else tuple(spec["population"])
    return AttackerView(spec["game"], targets, _remote_model(spec["model"], rpc), _remote_model(spec["base"], rpc),
                        _remote_model(spec["reference"], rpc), population, shadows, spec["public_format"],
                        spec["unit"], trainer)


def _score(cls: type, req: dict, rpc: _Remote) -> dict:
    from bench.attack import Scores
    raw = cls().score(_view(req["view"], rpc))
    details = None
    if isinstance(raw, Scores):
        raw, details = raw.values, raw.details
    if raw is None:
        raise PluginError(f"attack '{cls.name}' returned None: return one float per target (a missing `return` in "
                          f"score?)")
    try:
        array = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise PluginError(f"attack '{cls.name}' returned {type(raw).__name__}, not numbers: return one float per "
                          f"target") from None
    if array.ndim != 1:
        raise PluginError(f"attack '{cls.name}' returned an array of shape {array.shape}: return a flat array of "
                          f"one float per target, in the order given")
    values = [float(v) for v in array]
    return json.loads(json.dumps({"values": values, "details": details}, default=str))


def _loss_mask(instance, req: dict) -> list:
    mask = instance.pretrain_loss_mask(torch.as_tensor(req["ids"]))
    return torch.as_tensor(mask).to(torch.bool).cpu().tolist()


def _plugin_source(cls: type) -> list[str]:
    """[the plugin's source file, its directory], or [] where the class has no source file."""
    import inspect
    try:
        source = os.path.realpath(inspect.getsourcefile(cls) or "")
    except TypeError:
        return []
    return [source, os.path.dirname(source)]


def _plugin_frame(exc: BaseException, where: list[str]) -> str:
    """" (at file.py:LINE in FUNCTION)" for the innermost frame of the plugin's own code (its file first, else a
    module beside it), so that a failed submission says where: its worker and traceback are gone with the
    sandbox. "" when no frame is the plugin's."""
    import traceback
    if not where:
        return ""
    frames = [(os.path.realpath(f.filename), f) for f in traceback.extract_tb(exc.__traceback__)]
    own = [f for path, f in frames if path == where[0]] or \
        [f for path, f in frames if path.startswith(where[1].rstrip("/") + "/")]
    if not own:
        return ""
    f = own[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"


def main(workdir: str, report_fd: int | None = None) -> int:
    """The worker: trusted imports, the guard, the plugin; then one request after another until ``close``.
    ``report_fd``: where the guard reports a refusal, when not the number the first request names (a forked
    worker's, bench/fork_server.py)."""
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the plugin's prints go to stderr, never into the channel
    requests = sys.stdin.buffer

    def reply(**body: Any) -> None:
        channel.write(json.dumps(body) + "\n")
        channel.flush()

    plugin_source: list[str] = []  # the plugin's file and its directory, once it is loaded: where its frames are

    def failure(exc: BaseException) -> dict:
        if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)):
            return {"error": "memory limit exceeded", "memory": True}
        msg = str(exc) if isinstance(exc, PrivbenchError) else \
            f"the plugin raised {type(exc).__name__}: {exc}{_plugin_frame(exc, plugin_source)}"
        return {"error": (msg.splitlines()[0] if msg else type(exc).__name__)[:2000], "kind": type(exc).__name__}

    first = pickle.load(requests)
    from bench.plugin_ref import load_plugin
    from bench.sandbox import FAILURE_EXIT, MEMORY_EXIT, WORKER_WRITE_HINT, arm_sandbox
    # open for writing, from the child: the guard writes a refusal there
    report = int(first["report_fd"]) if report_fd is None else report_fd
    if first.get("confine"):
        from bench.confine import ConfinementError, confine
        try:
            confine(workdir, first["unreadable"])
        except ConfinementError as exc:
            reply(error=f"the plugin's worker could not be confined ({exc.strerror}); set PRIVBENCH_NO_CONFINE=1 "
                        f"to run it under the audit hook alone", kind="ConfinementError")
            return FAILURE_EXIT
    arm_sandbox(Path(workdir), report, unreadable=first["unreadable"], other_processes=False,
                write_hint=WORKER_WRITE_HINT, databases=False)
    try:
        kind, name, cls = load_plugin(PluginRef(**first["plugin"]))
        plugin_source.extend(_plugin_source(cls))
        reply(ok=_describe(kind, name, cls))
    except BaseException as exc:  # noqa: BLE001 - every failure of the plugin is reported to the child
        reply(**failure(exc))
        return FAILURE_EXIT
    rpc = _Remote(channel, requests)
    ops = {"adapt": lambda req: _adapt(cls, req), "pretrain_texts": lambda req: _pretrain_texts(cls, req),
           "score": lambda req: _score(cls, req, rpc)}
    mask_instance = None
    while True:
        try:
            req = pickle.load(requests)
        except EOFError:
            return 0
        if req.get("op") == "close":
            return 0
        try:
            if req.get("op") == "loss_mask":
                mask_instance = mask_instance or cls()
                reply(ok=_loss_mask(mask_instance, req))
            else:
                reply(ok=ops[req["op"]](req))
        except BaseException as exc:  # noqa: BLE001
            body = failure(exc)
            reply(**body)
            return MEMORY_EXIT if body.get("memory") else FAILURE_EXIT


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("error: usage: python -m bench.plugin_worker DIR (started by `privbench submit`)")
    sys.stdout.flush()
    os._exit(main(sys.argv[1]))
