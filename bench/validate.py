"""`privbench validate`: check a plugin before submitting it, with problems a researcher can act on.

The plugin is imported only in a sandboxed child (:mod:`bench.sandbox`, the same
guard as `privbench submit`, and the same read-only shared cache with a private
overlay that is discarded afterwards: :class:`bench.cache.OverlayCache`). The
child checks registration (kind, name, version, docstring, description,
parameters whose defaults validate), then runs the plugin on a tiny world of
the smoke suite (:data:`TINY_SUITE`): a defense must train and release a model
whose held-out loss is finite; an attack must give one finite score per target.
Each problem names its fix; exit status 0 only when every check passes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.plugin_ref import resolve_plugin
from bench.sandbox import FAILURE_EXIT, Limits, run_sandboxed

REPORT_FILE = "validate.json"
VIOLATION_FILE = "violation.json"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
VERSION_RE = re.compile(r"^\d+(\.\d+)*([.+-][0-9A-Za-z.+-]+)?$")

# the smoke suite's task and model, shrunk to one tiny world (tests/plugins/tiny.yaml is the same suite)
TINY_SUITE = {
    "name": "tiny",
    "description": "One tiny world on the nano model; the loss attack on the adapt and null games.",
    "seeds": [0],
    "tasks": [{"name": "mini_pile", "params": {"max_chars_per_source": 1500000}}],
    "models": [{"name": "nano", "params": {"pretrain_tokens": 30000, "reference_tokens": 20000}}],
    "defenses": ["finetune"],
    "attacks": ["loss"],
    "games": ["adapt", "null"],
    "world": {"n_per_group": 12, "n_null": 24, "adapt_background": 12},
    "reference": False,
    "metrics": {"n_boot": 50},
    "utility": {"n_heldout": 20},
}


@dataclass
class Check:
    name: str
    ok: bool
    problem: str = ""
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.name}"
        return f"FAIL  {self.name}: {self.problem}: {self.fix}"


def registration_checks(kind: str, name: str, cls: type) -> list[Check]:
    """Static checks of a registered plugin class (no training)."""
    from bench.attack import Attack
    from bench.defense import Defense
    from bench.params import Param
    out = [Check("kind", kind in ("attack", "defense"), f"registered as a {kind}",
                 "register with @register_defense or @register_attack")]
    if not out[0].ok:  # the checks below ask what an attack or a defense must be
        return out
    base = Defense if kind == "defense" else Attack
    out.append(Check("base class", issubclass(cls, base), f"{cls.__name__} does not subclass {base.__name__}",
                     f"derive it from bench.{kind}.{base.__name__}"))
    out.append(Check("name", bool(NAME_RE.match(name or "")), f"name {name!r} is not lower_snake_case",
                     "register it under a name like 'my_defense'"))
    version = getattr(cls, "version", "")
    out.append(Check("version", isinstance(version, str) and bool(VERSION_RE.match(version)),
                     f"version {version!r} is not a version string",
                     "set a class attribute like version = \"0.1.0\" and bump it when results change"))
    own = (cls.__doc__ or "").strip()
    if own == (base.__doc__ or "").strip():
        own = ""
    module = sys.modules.get(cls.__module__)
    doc = own or (module.__doc__ or "").strip() if module is not None else own  # a one-class module may say it there
    out.append(Check("docstring", bool(doc), "neither the class nor its module has a docstring",
                     "say in one paragraph what it does and why (cite the paper and equation)"))
    out.append(Check("description", bool(str(getattr(cls, "description", "")).strip()),
                     "no one-line description", "set description = \"...\" (shown by `privbench list`)"))
    params = getattr(cls, "params", ())
    bad = [p for p in params if not isinstance(p, Param)]
    out.append(Check("parameters", isinstance(params, tuple) and not bad,
                     f"params holds {bad[0]!r}" if bad else "params is not a tuple",
                     "declare params = (Param(name, type, default, help), ...) from bench.params"))
    missing_help = [p.name for p in params if isinstance(p, Param) and not p.help]
    out.append(Check("parameter help", not missing_help, f"parameters {missing_help} have no help text",
                     "give every Param a short help string"))
    try:
        cls()
        ok, problem = True, ""
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        ok, problem = False, f"{type(exc).__name__}: {exc}"
    out.append(Check("defaults validate", ok, problem, "make every default satisfy its own type and range"))
    if kind == "defense":
        out.append(Check("adapt", getattr(cls, "adapt", None) is not Defense.adapt, "adapt() is not implemented",
                         "implement adapt(self, model, data, ctx) and return Adapted(model, report, guarantee)"))
    else:
        out.append(Check("score", getattr(cls, "score", None) is not Attack.score,
                         "score() is not implemented", "implement score(self, view) returning one score per target"))
    return out


def tiny_world_check(kind: str, name: str, cls: type, *, cache, workdir: Path) -> Check:
    """Run the plugin on the tiny world of the smoke suite (:data:`TINY_SUITE`): a defense must release a model with a
    finite held-out loss, an attack one finite score per target in every game. In process: `privbench validate`
    calls it inside its sandboxed child, a plugin package's own tests call it directly (:mod:`bench.conformance`).
    ``cache`` is an :class:`~bench.cache.ArtifactCache` (the child's overlay) or a cache directory (None: the
    default one)."""
    from bench.cache import ArtifactCache
    from bench.runner import Runner
    from bench.store import Store
    from bench.submit import submission_suite
    from bench.suite import parse_suite

    raw = submission_suite(TINY_SUITE, kind, name, extend=False)
    if "reference_model" in set(getattr(cls, "requires", ()) or ()):
        raw["reference"] = True
    what = "trains and releases a model" if kind == "defense" else "scores every target"
    try:
        suite = parse_suite(raw, path=None)
        store = Store(f"sqlite:///{Path(workdir) / 'scratch.db'}")
        result = Runner(suite, store, cache if isinstance(cache, ArtifactCache) else ArtifactCache(cache),
                        quiet=True).run()
        if kind == "defense":
            util = [u for u in store.utility_rows(result.run_id) if u["role"] == "adapted" and u["defense"] == name
                    and u["metric"] == "loss"]
            ok = bool(util) and all(math.isfinite(u["value"]) for u in util)
            return Check(f"tiny world: {what}", ok, "the released model has no finite held-out loss",
                         "return Adapted(model, report, guarantee) with the adapted torch model (or a Release)")
        evs = store.evaluations(result.run_id)
        bad = []
        for e in evs:
            ids, labels, scores = store.scores_for(e["id"])
            if len(scores) != len(labels) or not all(math.isfinite(s) for s in scores):
                bad.append(e["game"])
        return Check(f"tiny world: {what}", bool(evs) and not bad, f"games {bad} lack one finite score per target",
                     "return a numpy array with one finite score per target, in the view's order")
    except MemoryError:
        return Check(f"tiny world: {what}", False, "memory limit exceeded", "use less memory")
    except Exception as exc:  # noqa: BLE001
        return Check(f"tiny world: {what}", False, f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                     f"fix the {kind} so the tiny smoke world runs end to end")


def validate(ref: str, *, cache: str | None = None, limits: Limits = Limits(wall_s=900),
             sandbox_dir: str | None = None) -> list[Check]:
    """All checks of ``ref`` (a .py file or entry-point name); the plugin runs only in a sandboxed child."""
    from bench.cache import OVERLAY_DIR, ArtifactCache, discard_overlay
    from bench.sandbox import check_apart
    from bench.submit import REPO_ROOT
    plugin = resolve_plugin(ref)
    cache_root = ArtifactCache(cache).root.resolve()
    if sandbox_dir:
        check_apart(Path(sandbox_dir).resolve(), [cache_root])
    box = Path(sandbox_dir).resolve() if sandbox_dir else Path(tempfile.mkdtemp(prefix="privbench-validate-"))
    box.mkdir(parents=True, exist_ok=True)
    overlay = box / OVERLAY_DIR
    spec = {"plugin": plugin.to_dict(), "cache": str(cache_root), "overlay": str(overlay), "sandbox": str(box)}
    (box / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PRIVBENCH_CACHE=str(overlay),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
                   os.pathsep) if p]))
    try:
        res = run_sandboxed([sys.executable, "-m", "bench.validate", "--child", str(box / "spec.json")],
                            sandbox=box, limits=limits, env=env, violation_file=box / VIOLATION_FILE,
                            read_only=[cache_root])
    finally:
        discard_overlay(overlay)  # as in `privbench submit`: nothing a sandbox built enters the shared cache
    checks: list[Check] = []
    try:
        checks = [Check(**c) for c in json.loads((box / REPORT_FILE).read_text())]
    except (OSError, ValueError, TypeError):
        pass
    failure = res.failure()
    if failure:
        checks.append(Check("sandbox", False, failure, "fix the plugin so it runs inside the limits, offline, "
                                                       "writing only under its working directory"))
    elif res.returncode not in (0, FAILURE_EXIT) or not checks:
        early = "" if checks else ", before its first check: did the plugin end the process (sys.exit, os._exit)?"
        checks.append(Check("child", False, f"validation did not finish (exit {res.returncode}{early})",
                            f"see {box}/child.stderr"))
    if not sandbox_dir and checks and all(c.ok for c in checks):
        shutil.rmtree(box, ignore_errors=True)  # kept when something failed, for its logs
    return checks


def _child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    box = Path(spec["sandbox"])
    checks: list[Check] = []

    def write() -> None:
        (box / REPORT_FILE).write_text(json.dumps([c.__dict__ for c in checks]))

    import bench.runner  # noqa: F401  (trusted imports before the guard is armed)
    import bench.submit  # noqa: F401,F811
    from bench.cache import OverlayCache
    from bench.plugin_ref import PluginRef, load_plugin
    from bench.sandbox import arm_sandbox

    cache = OverlayCache(spec["cache"], spec["overlay"])  # the shared cache read-only, new artifacts in the overlay
    arm_sandbox(box, box / VIOLATION_FILE)  # trusted work first, then the guard (writes: box only)

    try:
        kind, name, cls = load_plugin(PluginRef(**spec["plugin"]))
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("import", False, str(exc), "fix the plugin file, then validate it again"))
        write()
        return FAILURE_EXIT
    checks.append(Check("import", True))
    checks.extend(registration_checks(kind, name, cls))
    write()
    if not all(c.ok for c in checks):
        return FAILURE_EXIT
    checks.append(tiny_world_check(kind, name, cls, cache=cache, workdir=box))
    write()
    return 0 if all(c.ok for c in checks) else FAILURE_EXIT


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        os._exit(_child(sys.argv[2]))
    raise SystemExit("error: usage: python -m bench.validate --child SPEC.json (use `privbench validate` instead)")
