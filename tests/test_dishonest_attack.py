"""A dishonest attack, registered and run through the real runner on a tiny world, tries to read what it must
not: labels, evaluation non-members, challenger state, model internals, the training data. It must fail.

It probes through everything it receives (the AttackerView, its RestrictedModels, the targets, the population,
the reference trainer and its own ``self``): attribute access including private and dunder names, ``__dict__``,
``vars``, ``dir``, ``object.__getattribute__``, mutation, undeclared capabilities, its own stack
(``sys._getframe``, ``inspect.stack``) and ``gc.get_referrers`` chains. The vectors that stay open inside one
Python process (``gc.get_objects``, ``sys._current_frames``, closure cells) are demonstrated and must be
documented in docs/attacks.md: only running the attack in a separate process closes them.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from bench.attack import Attack
from bench.errors import CapabilityError
from bench.lm import FINETUNE_REFERENCE, POPULATION, REFERENCE_MODEL, TOKEN_LOGPROBS
from bench.registry import ATTACKS

ROOT = Path(__file__).resolve().parents[1]
GUESSES = ("labels", "_labels", "label", "members", "_members", "challenger", "_challenger", "instance", "inst",
           "_group", "group", "record_ids", "_data", "data", "world", "_model", "model", "_cache", "_tok",
           "_call", "adapted", "theta", "training_data", "texts", "_text", "spec", "runner", "store", "__dict__",
           "__closure__", "__self__", "__wrapped__", "_run", "f_back", "f_locals")


def _forbidden_types() -> tuple[type, ...]:
    import torch

    from bench.game import AdaptationData, Challenger, GameInstance
    from bench.lm import HFLanguageModel, SignalCache
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import Suite
    from bench.task import TaskData
    return (GameInstance, Challenger, Runner, Store, Suite, TaskData, AdaptationData, HFLanguageModel, SignalCache,
            torch.nn.Module, torch.Tensor)


PROBE: dict = {}


class DishonestAttack(Attack):
    """Scores honestly (negative loss) after trying every in-process route to forbidden state it can think of."""

    version = "0.0"
    requires = frozenset({TOKEN_LOGPROBS, POPULATION, REFERENCE_MODEL, FINETUNE_REFERENCE})

    def score(self, view):
        bad = _forbidden_types()
        found: list[str] = PROBE.setdefault("found", [])
        checks = PROBE.setdefault("checks", [0])

        def check(what: str, value) -> None:
            checks[0] += 1
            if isinstance(value, bad):
                found.append(f"{what}: {type(value).__name__}")
            if isinstance(value, dict):
                for v in list(value.values())[:50]:
                    if isinstance(v, bad):
                        found.append(f"{what}[...]: {type(v).__name__}")

        handles = {"view": view, "view.model": view.model, "view.base": view.base, "view.reference": view.reference,
                   "view.trainer": view.trainer, "target": view.targets[0], "self": self}
        # 1. attributes: declared, listed by dir(), guessed, private and dunder; __dict__ / vars / __getattribute__
        for where, obj in handles.items():
            if obj is None:
                continue
            for name in set(dir(obj)) | set(GUESSES):
                for getter in (getattr, object.__getattribute__):
                    try:
                        value = getter(obj, name)
                    except (AttributeError, TypeError):
                        continue
                    check(f"{where}.{name}", value)
                    if callable(value) and not isinstance(value, type):
                        for cell_attr in ("__self__", "__wrapped__", "__func__"):
                            check(f"{where}.{name}.{cell_attr}", getattr(value, cell_attr, None))
            if where == "target":   # a frozen dataclass: its __dict__ holds exactly its three public fields
                if set(vars(obj)) != {"id", "text", "samples"}:
                    found.append(f"target carries {sorted(vars(obj))}")
            elif where != "self":
                if hasattr(obj, "__dict__"):
                    found.append(f"{where} has a __dict__")
                try:
                    vars(obj)
                    found.append(f"vars({where}) worked")
                except TypeError:
                    checks[0] += 1
        for t in view.targets:
            assert {f.name for f in dataclasses.fields(t)} == {"id", "text", "samples"}
        # 2. mutation is refused
        for where, obj, name in (("view", view, "targets"), ("view.model", view.model, "fingerprint"),
                                 ("view.trainer", view.trainer, "start"), ("target", view.targets[0], "text")):
            try:
                setattr(obj, name, None)
                found.append(f"{where}.{name} could be overwritten")
            except (AttributeError, dataclasses.FrozenInstanceError):
                checks[0] += 1
        # 3. undeclared capabilities are refused
        try:
            view.model.generate(["x"], 2)
            found.append("generate without declaring it")
        except CapabilityError:
            checks[0] += 1
        # 4. own stack: no runner frame, no forbidden local, the walk ends at the thread start
        frames = []
        f = sys._getframe()
        while f is not None:
            frames.append(f)
            f = f.f_back
        frames += [fi.frame for fi in inspect.stack(0)]
        for fr in frames:
            if fr.f_code.co_filename.endswith(("bench/runner.py", "bench/game.py")):
                found.append(f"runner frame on the attack's stack: {fr.f_code.co_name}")
            for k, v in list(fr.f_locals.items()):
                check(f"frame {fr.f_code.co_name}.{k}", v)
        PROBE.setdefault("stack_depth", []).append(len(frames) // 2)
        del frames, f, fr
        # 5. gc.get_referrers chains from everything the attack received (not through frames or closures)
        starts = [view, view.targets, *view.targets, *(t.text for t in view.targets), *(t.id for t in view.targets),
                  view.population, *view.population[:20], view.model, view.reference, view.trainer, self]
        PROBE.setdefault("referrer_objects", [0])
        _referrer_walk(starts, check, found, PROBE["referrer_objects"])
        del starts
        # 6. the vectors only process isolation closes: record that they are open (the test checks the docs)
        open_vectors = PROBE.setdefault("open", set())
        if any(isinstance(o, bad[0]) for o in gc.get_objects()):
            open_vectors.add("gc.get_objects")
        for fr in sys._current_frames().values():
            while fr is not None:
                if fr.f_code.co_filename.endswith("bench/runner.py"):
                    open_vectors.add("sys._current_frames")
                fr = fr.f_back
        cells = view.model._call.__closure__ or ()
        if any(isinstance(c.cell_contents, bad) for c in cells):
            open_vectors.add("__closure__")
        return np.array([-s.nll() for s in view.model.token_signals(view.texts)])


def _referrer_walk(starts, check, found, counter, depth: int = 4, limit: int = 20000) -> None:
    """Breadth-first over gc.get_referrers, skipping frames, module globals, types and this walk's own lists."""
    mine = set()
    frontier = list(starts)
    seen = {id(o) for o in frontier}
    mine.update({id(frontier), id(starts), id(seen), id(mine)})
    for level in range(depth):
        nxt = []
        mine.add(id(nxt))
        for obj in frontier:
            if obj is None or (isinstance(obj, str) and len(obj) <= 1):
                continue
            for r in gc.get_referrers(obj):
                if id(r) in mine or id(r) in seen or isinstance(r, (types.FrameType, type, types.ModuleType)):
                    continue
                if isinstance(r, dict) and r.get("__name__") in sys.modules:   # a module's globals: code, not state
                    continue
                seen.add(id(r))
                counter[0] += 1
                check(f"gc.get_referrers level {level + 1}", r)
                nxt.append(r)
                if len(seen) > limit:
                    found.append("referrer walk did not terminate")
                    return
        frontier = nxt


@pytest.fixture
def dishonest(monkeypatch):
    monkeypatch.setitem(ATTACKS._classes, "dishonest", DishonestAttack)
    DishonestAttack.name = "dishonest"
    PROBE.clear()
    yield
    PROBE.clear()


def test_dishonest_attack_through_the_runner_finds_nothing(cache, tmp_path, dishonest):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite
    from worlds import TINY

    store = Store(str(tmp_path / "r.db"))
    raw = dict(TINY, attacks=["loss", "dishonest"], games=["adapt", "joint/fresh", "null"])
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 6
    assert PROBE["found"] == [], PROBE["found"]
    assert PROBE["checks"][0] > 500 and PROBE["referrer_objects"][0] > 0   # the probes really ran
    assert max(PROBE["stack_depth"]) <= 6          # thread bootstrap + the hand-over + score: no runner frames
    # the honest scores it returned after probing are stored like any attack's, equal to the loss attack's
    ev = {(r["game"], r["attack"]): r["value"] for r in store.metric_rows(result.run_id) if r["metric"] == "auc"}
    for game in ("adapt", "joint/fresh", "null"):
        assert ev[(game, "dishonest")] == pytest.approx(ev[(game, "loss")])
    # what stays open in one process is documented, vector by vector
    docs = (ROOT / "docs" / "attacks.md").read_text()
    assert PROBE["open"], "no in-process vector open any more: update docs/attacks.md"
    for vector in PROBE["open"]:
        assert f"`{vector}`" in docs, f"{vector} is open in-process but not documented in docs/attacks.md"


def test_run_attack_hands_over_without_keeping_references():
    """run_attack keeps no reference to the view in its caller's frame and scores a fresh instance of the attack."""
    from bench.attack import run_attack
    from bench.game import AttackerView, Target
    from bench.lm import RestrictedModel
    from tests.fakes import UnigramLM

    seen = {}

    class Peek(Attack):
        version = "0.0"

        def score(self, view):
            seen["referrers"] = [r for r in gc.get_referrers(view) if not isinstance(r, types.FrameType)]
            seen["self_referrers"] = [r for r in gc.get_referrers(self) if not isinstance(r, types.FrameType)]
            self.kept = "state"
            return np.zeros(len(view.targets))

    Peek.name = "peek"
    lm = UnigramLM(["abc"])
    attack = Peek()
    holder = [attack]
    out = run_attack(attack, AttackerView("adapt", (Target("1", "abc"), Target("2", "xyz")),
                                          RestrictedModel(lm, frozenset({TOKEN_LOGPROBS}), "released"), None, None,
                                          None))
    assert out.tolist() == [0.0, 0.0]
    assert seen["referrers"] == []                     # only the attack's own frames hold the view
    assert all(r is not holder for r in seen["self_referrers"])   # the suite's instance is not the one scoring
    assert not hasattr(attack, "kept")                 # nothing the scoring instance kept comes back
