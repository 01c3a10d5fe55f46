"""Tests for bench.game: every game against its definition, what the attacker and defenses see, and isolation.

The expected table is written out here independently of ``bench.game.GAMES``
(it is the table of the module docstring), so a wrong GameSpec fails a test.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import types
import weakref
from collections import Counter

import numpy as np
import pytest

from attacks.loss import LossAttack
from bench.attack import Attack, run_attack
from bench.errors import CapabilityError, DataError, PluginError
from bench.game import DEFAULT_GAMES, GAMES, AdaptationData, Challenger, GameInstance, Target
from bench.lm import LanguageModel, RestrictedModel
from bench.metrics import roc_auc
from fakes import UnigramLM, make_task_data

N_PER_GROUP, N_NULL, BACKGROUND = 20, 40, 10
WORLD = {"n_per_group": N_PER_GROUP, "n_null": N_NULL, "adapt_background": BACKGROUND}

# game -> (positive groups, negative groups, n_pos, n_neg, released target model, base released)
# the four groups have N_PER_GROUP units each (a and b independent); the null game has its own pool of N_NULL
EXPECTED = {
    "pretrain": ({(1, 0), (1, 1)}, {(0, 0), (0, 1)}, 2 * N_PER_GROUP, 2 * N_PER_GROUP, "pretrained", False),
    "adapt": ({(0, 1), (1, 1)}, {(0, 0), (1, 0)}, 2 * N_PER_GROUP, 2 * N_PER_GROUP, "adapted", False),
    "joint/fresh": ({(0, 1)}, {(0, 0)}, N_PER_GROUP, N_PER_GROUP, "adapted", True),
    "joint/seen": ({(1, 1)}, {(1, 0)}, N_PER_GROUP, N_PER_GROUP, "adapted", True),
    "joint/both": ({(1, 1)}, {(0, 0)}, N_PER_GROUP, N_PER_GROUP, "adapted", True),
    "post_adapt": ({(1, 0)}, {(0, 0)}, N_PER_GROUP, N_PER_GROUP, "adapted", True),
    "null": ({"null"}, {"null"}, N_NULL // 2, N_NULL // 2, "adapted", False),
}
ALL_REQUIRES = frozenset({"token_logprobs", "next_token_distribution", "generate", "reference_model", "population"})


@pytest.fixture(scope="module")
def data():
    return make_task_data(n_targets=400, n_adapt=200)


@pytest.fixture(scope="module")
def ch(data):
    return Challenger(data, WORLD, seed=0)


@pytest.fixture(scope="module")
def models(data):
    """Three distinct models: θ (A), θ' (B), the attacker's reference (R)."""
    return (UnigramLM(data.pretrain, name="A"), UnigramLM(data.adapt, name="B"),
            UnigramLM(data.population, name="R"))


def all_record_ids(ch: Challenger) -> list[str]:
    # the pretrain game covers all four groups, so it lists every target of the world
    return list(ch.instance(GAMES["pretrain"]).record_ids)


def text_of(data) -> dict[str, str]:
    return {r.id: r.text for r in data.targets}


# ---------------------------------------------------------------------------------------- the table

def test_games_are_exactly_the_table():
    assert set(DEFAULT_GAMES) == set(EXPECTED) and set(GAMES) == set(EXPECTED) | {"audit", "audit/pretrain"}
    # the audit games: tests/test_audit_game.py
    assert GAMES["audit"].audit_pool and GAMES["audit/pretrain"].audit_pool
    assert (GAMES["audit"].target_model, GAMES["audit/pretrain"].target_model) == ("adapted", "pretrained")
    assert not any(GAMES[g].audit_pool for g in EXPECTED)
    for name, (_, _, _, _, target_model, releases_base) in EXPECTED.items():
        assert GAMES[name].target_model == target_model, name
        assert GAMES[name].releases_base is releases_base, name


def group_or_null(ch: Challenger, r: str):
    return "null" if r in ch.null_units() else ch.group_of(r)


def test_world_group_sizes(ch):
    groups = Counter(ch.group_of(r) for r in all_record_ids(ch))
    assert groups == {(0, 0): N_PER_GROUP, (0, 1): N_PER_GROUP, (1, 0): N_PER_GROUP, (1, 1): N_PER_GROUP}
    # the null pool is its own set of units, in no group and in no other game
    assert len(ch.null_units()) == N_NULL and not set(ch.null_units()) & set(all_record_ids(ch))
    assert all(ch.never_inserted(u) for u in ch.null_units())


@pytest.mark.parametrize("game", list(EXPECTED))
def test_instance_matches_definition(ch, data, game):
    pos_groups, neg_groups, n_pos, n_neg, _, _ = EXPECTED[game]
    inst = ch.instance(GAMES[game])
    labels = np.asarray(inst.labels)
    assert len(inst.targets) == len(inst.record_ids) == len(labels) == n_pos + n_neg
    assert set(np.unique(labels)) == {0, 1}
    assert (inst.n_pos, inst.n_neg) == (n_pos, n_neg)
    pos = [r for r, y in zip(inst.record_ids, labels) if y == 1]
    neg = [r for r, y in zip(inst.record_ids, labels) if y == 0]
    assert {group_or_null(ch, r) for r in pos} == pos_groups
    assert {group_or_null(ch, r) for r in neg} == neg_groups
    assert len(set(inst.record_ids)) == len(inst.record_ids)  # no target twice
    assert not set(pos) & set(neg)
    # every target of a positive/negative group is in the game (not a subset)
    everyone = all_record_ids(ch)
    if not GAMES[game].null_split:
        assert set(pos) == {r for r in everyone if ch.group_of(r) in pos_groups}
        assert set(neg) == {r for r in everyone if ch.group_of(r) in neg_groups}
    # the text shown is the record's text
    texts = text_of(data)
    assert [t.text for t in inst.targets] == [texts[r] for r in inst.record_ids]


def test_null_game_splits_its_own_pool_in_disjoint_halves(ch):
    inst = ch.instance(GAMES["null"])
    pos = {r for r, y in zip(inst.record_ids, inst.labels) if y == 1}
    neg = {r for r, y in zip(inst.record_ids, inst.labels) if y == 0}
    assert len(pos) == len(neg) == N_NULL // 2
    assert not pos & neg
    assert pos | neg == set(ch.null_units())
    # no unit of the null game is shown by any other game
    for name in EXPECTED:
        if name != "null":
            assert not set(ch.instance(GAMES[name]).record_ids) & (pos | neg), name


@pytest.mark.parametrize("game", list(EXPECTED))
def test_target_ids_are_opaque_and_order_shuffled(ch, game):
    inst = ch.instance(GAMES[game])
    ids = [t.id for t in inst.targets]
    assert len(set(ids)) == len(ids)
    for tid, rid in zip(ids, inst.record_ids):
        assert tid != rid
        assert rid not in tid
        assert rid.split("-")[-1] not in tid  # not even the record's number
    labels = list(inst.labels)
    assert labels != sorted(labels) and labels != sorted(labels, reverse=True)
    assert list(inst.record_ids) != sorted(inst.record_ids)
    # ids are not the same across games either, so games cannot be linked by id
    if game == "null":  # the null pool is shown by no other game: nothing to link
        return
    other = ch.instance(GAMES["pretrain" if game != "pretrain" else "adapt"])
    other_ids = {r: t.id for r, t in zip(other.record_ids, other.targets)}
    shared = [r for r in inst.record_ids if r in other_ids]
    assert shared
    mine = {r: t.id for r, t in zip(inst.record_ids, inst.targets)}
    assert all(mine[r] != other_ids[r] for r in shared)


def test_same_seed_same_instance_different_seed_different_world(data):
    a, b, c = (Challenger(data, WORLD, seed=s) for s in (0, 0, 1))
    for game in GAMES.values():
        ia, ib = a.instance(game), b.instance(game)
        assert ia.targets == ib.targets
        assert ia.record_ids == ib.record_ids
        assert np.array_equal(ia.labels, ib.labels)
    assert a.world_key == b.world_key != c.world_key
    ga = {r: a.group_of(r) for r in all_record_ids(a)}
    gc_ = {r: c.group_of(r) for r in all_record_ids(c)}
    assert ga != gc_
    assert a.pretraining_inserts() != c.pretraining_inserts()
    assert a.adaptation_data() == b.adaptation_data() != c.adaptation_data()


def test_world_needs_enough_data(data):
    with pytest.raises(DataError, match="target records"):
        Challenger(data, {"n_per_group": 200, "n_null": 200}, seed=0)
    with pytest.raises(DataError, match="adapt_background"):
        Challenger(data, {"n_per_group": 4, "n_null": 8, "adapt_background": 10_000}, seed=0)


# ---------------------------------------------------------------------------------------- training data

def test_pretraining_inserts_are_exactly_the_a1_targets(data):
    ch = Challenger(data, dict(WORLD, pretrain_target_repeats=3), seed=0)
    texts = text_of(data)
    a1 = [texts[r] for r in all_record_ids(ch) if ch.group_of(r)[0] == 1]
    assert len(a1) == 2 * N_PER_GROUP
    assert Counter(ch.pretraining_inserts()) == Counter({t: 3 for t in a1})
    single = Challenger(data, WORLD, seed=0)
    assert Counter(single.pretraining_inserts()) == Counter(a1)


def test_adaptation_data_is_background_plus_b1_targets(ch, data):
    ad = ch.adaptation_data()
    texts = text_of(data)
    b1 = [texts[r] for r in all_record_ids(ch) if ch.group_of(r)[1] == 1]
    assert len(b1) == 2 * N_PER_GROUP
    assert Counter(ad.texts) == Counter(list(data.adapt[:BACKGROUND]) + b1)
    # it holds only a tuple of strings: no ids, no marks
    assert [f.name for f in dataclasses.fields(AdaptationData)] == ["texts", "users", "secrets", "secret_targets",
                                                                 "validation"]
    assert ad.users is None and ad.secrets is None and ad.secret_targets is None
    assert isinstance(ad.texts, tuple) and all(type(t) is str for t in ad.texts)
    assert not hasattr(ad, "__slots__") or ad.__slots__ == ()
    assert set(vars(ad)) == {"texts", "users", "secrets", "secret_targets", "validation"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ad.texts = ()
    # shuffled: the targets are not simply appended after the background
    positions = [i for i, t in enumerate(ad.texts) if t in set(b1)]
    assert positions != list(range(BACKGROUND, BACKGROUND + len(b1)))
    assert positions != list(range(len(b1)))


# ---------------------------------------------------------------------------------------- released models

@pytest.mark.parametrize("game", list(EXPECTED))
def test_released_models_per_game(ch, data, models, game):
    A, B, R = models
    inst = ch.instance(GAMES[game])
    view = ch.view(inst, requires=frozenset({"token_logprobs", "reference_model"}), pretrained=A, adapted=B,
                   reference=R, population=data.population)
    target_model, releases_base = EXPECTED[game][4], EXPECTED[game][5]
    expected = A if target_model == "pretrained" else B
    assert isinstance(view.model, RestrictedModel)
    assert view.model.fingerprint == expected.fingerprint
    # and it really calls that model, not only carries its fingerprint
    before_a, before_b = len(A.calls), len(B.calls)
    view.model.token_signals(["abc"])
    assert (len(A.calls) - before_a, len(B.calls) - before_b) == ((1, 0) if expected is A else (0, 1))
    if releases_base:
        assert isinstance(view.base, RestrictedModel)
        assert view.base.fingerprint == A.fingerprint
        assert view.calibration_model() is view.base
    else:
        assert view.base is None
        assert view.calibration_model() is view.reference
    assert view.reference is not None and view.reference.fingerprint == R.fingerprint
    assert view.population is None  # not declared, not given
    assert view.game == game
    assert view.targets == inst.targets
    assert view.texts == [t.text for t in inst.targets]


@pytest.mark.parametrize("game", list(EXPECTED))
def test_reference_attack_without_reference_model(ch, models, game):
    A, B, _ = models
    inst = ch.instance(GAMES[game])
    kwargs = dict(requires=frozenset({"token_logprobs", "reference_model"}), pretrained=A, adapted=B,
                  reference=None, population=None, attack_name="my_ref")
    if EXPECTED[game][5]:
        view = ch.view(inst, **kwargs)  # the released θ calibrates
        assert view.reference is None
        assert view.calibration_model().fingerprint == A.fingerprint
    else:
        with pytest.raises(CapabilityError, match="my_ref"):
            ch.view(inst, **kwargs)


def test_population_only_when_declared_and_available(ch, data, models):
    A, B, _ = models
    inst = ch.instance(GAMES["adapt"])
    view = ch.view(inst, requires=frozenset({"token_logprobs", "population"}), pretrained=A, adapted=B,
                   reference=None, population=list(data.population))
    assert view.population == data.population and isinstance(view.population, tuple)
    with pytest.raises(CapabilityError, match="population"):
        ch.view(inst, requires=frozenset({"population"}), pretrained=A, adapted=B, reference=None, population=())


def test_view_needs_an_adapted_model_for_adapted_games(ch, models):
    A, _, _ = models
    with pytest.raises(CapabilityError):
        ch.view(ch.instance(GAMES["adapt"]), requires=frozenset({"token_logprobs"}), pretrained=A, adapted=None,
                reference=None, population=None)
    view = ch.view(ch.instance(GAMES["pretrain"]), requires=frozenset({"token_logprobs"}), pretrained=A,
                   adapted=None, reference=None, population=None)
    assert view.model.fingerprint == A.fingerprint


# ---------------------------------------------------------------------------------------- isolation

_ATOMS = (str, bytes, int, float, complex, bool, type(None), np.generic)


def reachable(root, stop=lambda o: False):
    """Every object reachable from ``root`` through attributes, slots, containers, dataclass fields,
    bound methods and function closures. Objects for which ``stop`` is true are yielded, not entered.
    Classes and modules are yielded but not entered (they are shared code, not per-view state);
    function globals are not followed for the same reason."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, _ATOMS) or isinstance(obj, (type, types.ModuleType)) or stop(obj):
            continue
        children: list = []
        if isinstance(obj, dict):
            children += list(obj.keys()) + list(obj.values())
        elif isinstance(obj, (tuple, list, set, frozenset)):
            children += list(obj)
        elif isinstance(obj, np.ndarray):
            if obj.dtype == object:
                children += list(obj.ravel())
            continue
        if isinstance(obj, types.MethodType):
            children += [obj.__self__, obj.__func__]
        if isinstance(obj, types.FunctionType):
            children += [c.cell_contents for c in (obj.__closure__ or ()) if _cell_full(c)]
            children += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
        if isinstance(obj, functools.partial):
            children += [obj.func, *obj.args, *obj.keywords.values()]
        if dataclasses.is_dataclass(obj):
            children += [getattr(obj, f.name) for f in dataclasses.fields(obj) if hasattr(obj, f.name)]
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            children += list(d.values())
        for klass in type(obj).__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for s in (slots,) if isinstance(slots, str) else slots:
                if s in ("__dict__", "__weakref__"):
                    continue
                try:
                    children.append(object.__getattribute__(obj, s))
                except AttributeError:
                    pass
        stack.extend(children)


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _raw_model(o) -> bool:
    return isinstance(o, LanguageModel) and not isinstance(o, RestrictedModel)


def test_walker_follows_closures_and_slots(ch, models):
    """Positive control: the walker does find a challenger hidden in a closure inside a slot."""
    hidden = ch

    def sneaky():
        return hidden

    holder = RestrictedModel(models[0], frozenset({"token_logprobs"}), "x")
    found = list(reachable((holder, types.MethodType(lambda self: None, (1, sneaky))), stop=_raw_model))
    assert any(o is ch for o in found)
    assert any(o is models[0] for o in found)  # reached through RestrictedModel._call's closure
    assert not any(o is ch._data for o in reachable(holder, stop=_raw_model))


def _all_task_texts(data) -> set[str]:
    return set(data.pretrain) | set(data.heldout) | set(data.population) | set(data.adapt) | {
        r.text for r in data.targets}


@pytest.mark.parametrize("game", list(EXPECTED))
def test_attacker_view_reaches_no_challenger_state(ch, data, models, game):
    A, B, R = models
    inst = ch.instance(GAMES[game])
    view = ch.view(inst, requires=ALL_REQUIRES, pretrained=A, adapted=B, reference=R, population=data.population)
    found = list(reachable(view, stop=_raw_model))
    released = A if EXPECTED[game][4] == "pretrained" else B
    assert any(o is released for o in found)  # the walk does reach the released model (through a closure)
    assert any(o is R for o in found)
    assert any(o is A for o in found) is (EXPECTED[game][4] == "pretrained" or EXPECTED[game][5])
    record_ids = set(inst.record_ids) | set(all_record_ids(ch))
    allowed = {t.text for t in inst.targets} | set(data.population)
    forbidden_texts = _all_task_texts(data) - allowed
    assert forbidden_texts
    for o in found:
        assert not isinstance(o, (Challenger, GameInstance)), type(o)
        assert o is not ch._data and o is not ch.config
        if isinstance(o, np.ndarray):
            assert not (o.shape == inst.labels.shape and np.array_equal(o, inst.labels)), "labels reachable"
        if isinstance(o, str):
            assert o not in record_ids, f"record id {o!r} reachable"
            assert o not in forbidden_texts, f"text outside the game reachable: {o[:40]!r}"


def test_adaptation_data_reaches_no_challenger_state(ch, data):
    ad = ch.adaptation_data()
    record_ids = set(all_record_ids(ch))
    allowed = set(ad.texts) | set(ad.validation or ())
    # validation records are held back from the adaptation pool: never targets, never trained on
    assert not set(ad.validation or ()) & set(ch.target_texts()) and not set(ad.validation or ()) & set(ad.texts)
    everything = _all_task_texts(data)
    for o in reachable(ad):
        assert not isinstance(o, (Challenger, GameInstance, np.ndarray, LanguageModel)), type(o)
        if isinstance(o, str):
            assert o not in record_ids
            assert o in allowed or o not in everything


def _isolated_view(data, models, game="joint/both"):
    """A view whose challenger and instance are out of scope once this returns (weak references kept)."""
    A, B, R = models
    ch = Challenger(data, WORLD, seed=3)
    inst = ch.instance(GAMES[game])
    view = ch.view(inst, requires=ALL_REQUIRES, pretrained=A, adapted=B, reference=R, population=data.population)
    return view, weakref.ref(ch), weakref.ref(inst), inst.labels.copy()


def test_view_does_not_keep_challenger_or_instance_alive(data, models):
    view, ch_ref, inst_ref, _ = _isolated_view(data, models)
    gc.collect()
    assert view.targets  # the view is alive...
    assert ch_ref() is None and inst_ref() is None  # ...but nothing of the challenger's side is


class DishonestAttack(Attack):
    """Tries to read labels or challenger state from inside the attack. Records what each attempt got.

    In-process Python is not a security boundary (``object.__setattr__``, closures' ``cell_contents``
    and ``gc`` can reach far); the submission sandbox is. These tests check that the view offers no
    *direct* path: no label attribute, no challenger handle, no raw model, no mutation.
    """

    name = "dishonest"
    #: where the test reads what the attempts got: each evaluation scores with a fresh instance, so the results
    #: leave through class-level state (an in-process channel docs/attacks.md lists)
    last_results: dict = {}

    def score(self, view):
        self.results = type(self).last_results = {}

        def attempt(key, fn):
            try:
                self.results[key] = ("ok", fn())
            except AttributeError as exc:
                self.results[key] = ("AttributeError", str(exc))

        attempt("labels", lambda: view.labels)
        attempt("_challenger", lambda: view._challenger)
        attempt("challenger", lambda: view.challenger)
        attempt("record_ids", lambda: view.record_ids)
        attempt("setattr_labels", lambda: setattr(view, "labels", [1]))
        attempt("setattr_game", lambda: setattr(view, "game", "pretrain"))
        attempt("setattr_targets", lambda: setattr(view, "targets", ()))
        attempt("view_dict", lambda: view.__dict__)
        attempt("model_raw", lambda: view.model._model)
        attempt("model_wrapped", lambda: view.model.model)
        attempt("model_dict", lambda: dict(view.model.__dict__))
        attempt("model_setattr", lambda: setattr(view.model, "fingerprint", "forged"))
        attempt("target_label", lambda: view.targets[0].label)
        found = []
        for ref in gc.get_referrers(view):
            candidates = [ref]
            if isinstance(ref, types.FrameType):
                candidates += list(ref.f_locals.values())
            elif isinstance(ref, dict):
                candidates += list(ref.values())
            elif isinstance(ref, (list, tuple)):
                candidates += list(ref)
            found += [c for c in candidates if isinstance(c, (Challenger, GameInstance))]
        self.results["gc_referrers"] = found
        return np.zeros(len(view.targets))


def test_dishonest_attack_finds_nothing(data, models):
    view, _, _, labels = _isolated_view(data, models)
    gc.collect()
    attack = DishonestAttack()
    scores = run_attack(attack, view)
    assert scores.shape == (len(labels),)
    r = DishonestAttack.last_results
    for key in ("labels", "_challenger", "challenger", "record_ids", "setattr_labels", "setattr_game",
                "setattr_targets", "view_dict", "model_raw", "model_wrapped", "model_setattr", "target_label"):
        assert r[key][0] == "AttributeError", (key, r[key])
    # the released handle may have an (empty) instance dict, but it holds nothing
    assert r["model_dict"][0] == "AttributeError" or r["model_dict"][1] == {}
    assert r["gc_referrers"] == []
    assert view.game == "joint/both" and view.model.fingerprint == models[1].fingerprint  # nothing changed


def test_target_carries_only_id_and_text():
    assert [f.name for f in dataclasses.fields(Target)] == ["id", "text", "samples"]
    t = Target("x", "y")
    assert t.samples == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.id = "z"


# ---------------------------------------------------------------------------------------- RestrictedModel

def test_restricted_model_only_releases_declared_capabilities(ch, models):
    A, B, _ = models
    view = ch.view(ch.instance(GAMES["joint/fresh"]), requires=frozenset({"token_logprobs"}), pretrained=A,
                   adapted=B, reference=None, population=None)
    n_a, n_b = len(A.calls), len(B.calls)
    for handle in (view.model, view.base):
        assert handle.capabilities == frozenset({"token_logprobs"})
        with pytest.raises(CapabilityError, match="next_token_distribution"):
            handle.next_token_logprobs(["ab"])
        with pytest.raises(CapabilityError, match="generate"):
            handle.generate(["ab"], 3)
    assert (len(A.calls), len(B.calls)) == (n_a, n_b)  # the refused calls never reached the models
    sig = view.model.token_signals(["hello"])
    assert len(sig) == 1 and sig[0].n_tokens == 5
    assert np.allclose(sig[0].logprobs, B.token_signals(["hello"])[0].logprobs)
    np.testing.assert_allclose(view.model.nll(["hello"]), B.nll(["hello"]))

    full = ch.view(ch.instance(GAMES["joint/fresh"]), requires=ALL_REQUIRES, pretrained=A, adapted=B,
                   reference=None, population=("p",))
    assert full.model.next_token_logprobs(["ab"]).shape == (1, 256)
    assert full.model.generate(["ab"], 2) == B.generate(["ab"], 2)


def test_restricted_model_cannot_be_mutated(ch, models):
    A, B, _ = models
    view = ch.view(ch.instance(GAMES["adapt"]), requires=frozenset({"token_logprobs"}), pretrained=A, adapted=B,
                   reference=None, population=None)
    for name, value in (("fingerprint", "forged"), ("capabilities", frozenset({"generate"})), ("role", "base"),
                        ("_call", lambda *a: None), ("new_attribute", 1)):
        with pytest.raises(AttributeError):
            setattr(view.model, name, value)
    with pytest.raises(AttributeError):
        view.model = A
    assert view.model.fingerprint == B.fingerprint
    assert view.model.capabilities == frozenset({"token_logprobs"})


def test_view_and_model_attributes_cannot_be_deleted(ch, models):
    A, B, _ = models
    view = ch.view(ch.instance(GAMES["adapt"]), requires=frozenset({"token_logprobs"}), pretrained=A, adapted=B,
                   reference=None, population=None)
    with pytest.raises(AttributeError):
        del view.model.fingerprint
    with pytest.raises(AttributeError):
        del view.targets


# ---------------------------------------------------------------------------------------- run_attack contract

def _small_view(ch, models):
    A, B, _ = models
    return ch.view(ch.instance(GAMES["joint/seen"]), requires=frozenset({"token_logprobs"}), pretrained=A,
                   adapted=B, reference=None, population=None)


def _attack(name, fn, requires=frozenset({"token_logprobs"})):
    return type("T", (Attack,), {"name": name, "requires": requires, "score": lambda self, view: fn(view)})()


@pytest.mark.parametrize("label,fn,match", [
    ("nan_attack", lambda v: [float("nan")] + [0.0] * (len(v.targets) - 1), "NaN"),
    ("inf_attack", lambda v: [float("inf")] * len(v.targets), "infinite"),
    ("short_attack", lambda v: [0.0] * (len(v.targets) - 1), "scores for"),
    ("long_attack", lambda v: np.zeros(len(v.targets) + 1), "scores for"),
    ("string_attack", lambda v: "high", "not numbers"),
    ("strings_attack", lambda v: ["a"] * len(v.targets), "not numbers"),
    ("raising_attack", lambda v: (_ for _ in ()).throw(ValueError("boom")), "ValueError: boom"),
    ("none_attack", lambda v: None, "returned None: return one float per target"),
    ("matrix_attack", lambda v: np.zeros((len(v.targets), 1)), r"returned an array of shape \(\d+, 1\)"),
    ("scalar_attack", lambda v: 0.5, r"returned an array of shape \(\)"),
])
def test_run_attack_rejects_contract_violations(ch, models, label, fn, match):
    with pytest.raises(PluginError, match=match) as err:
        run_attack(_attack(label, fn), _small_view(ch, models))
    assert f"'{label}'" in str(err.value)


def test_run_attack_rejects_unknown_capability(ch, models):
    with pytest.raises(PluginError, match="telepathy"):
        run_attack(_attack("odd", lambda v: [0.0] * len(v.targets), frozenset({"telepathy"})), _small_view(ch, models))


def test_run_attack_lets_capability_errors_through(ch, models):
    # a CapabilityError is the user's configuration problem, not a plugin bug: it is not re-wrapped
    attack = _attack("greedy", lambda v: v.model.generate(v.texts, 2))
    with pytest.raises(CapabilityError) as err:
        run_attack(attack, _small_view(ch, models))
    assert not isinstance(err.value, PluginError)


def test_run_attack_returns_float64_per_target(ch, models):
    view = _small_view(ch, models)
    scores = run_attack(_attack("ints", lambda v: list(range(len(v.targets)))), view)
    assert isinstance(scores, np.ndarray) and scores.dtype == np.float64
    assert scores.shape == (len(view.targets),)
    assert scores.tolist() == [float(i) for i in range(len(view.targets))]
    loss = run_attack(LossAttack(), view)
    assert loss.dtype == np.float64 and np.all(np.isfinite(loss)) and np.all(loss < 0)


# ---------------------------------------------------------------------------------------- null-game sanity

def test_loss_attack_null_game_near_chance_adapt_game_above():
    data = make_task_data(n_targets=400, n_adapt=200, seed=1)
    ch = Challenger(data, {"n_per_group": 20, "n_null": 200, "adapt_background": 0}, seed=0)
    adapted = UnigramLM(ch.adaptation_data().texts, name="adapted")
    pretrained = UnigramLM(data.pretrain, name="pretrained")
    auc = {}
    for game in ("null", "adapt", "joint/fresh"):
        inst = ch.instance(GAMES[game])
        view = ch.view(inst, requires=LossAttack.requires, pretrained=pretrained, adapted=adapted, reference=None,
                       population=None)
        auc[game] = roc_auc(inst.labels, run_attack(LossAttack(), view))
    assert abs(auc["null"] - 0.5) <= 0.15, auc
    assert auc["adapt"] >= 0.62, auc
    assert auc["joint/fresh"] >= 0.62, auc


# ---------------------------------------------------------------------------------------- membership units

def test_record_level_view_has_unit_record_and_no_samples(ch, models):
    inst = ch.instance(GAMES["adapt"])
    view = ch.view(inst, requires=LossAttack.requires, pretrained=models[0], adapted=models[1], reference=None,
                   population=None)
    assert view.unit == "record" and ch.unit == "record" and ch.sample_texts() == []
    assert all(t.samples == () for t in view.targets)
    assert list(inst.record_ids) == [ch.unit_of(r) for r in inst.record_ids]


def test_unit_tasks_are_drawn_not_refused(data):
    """A user task plays: each user's records share one group, and a game shows one target per user."""
    meta = {r.id: {"user": f"u{i // 4}"} for i, r in enumerate(data.targets)}  # 100 users of 4 records
    users = dataclasses.replace(data, unit="user", target_meta=meta)
    ch = Challenger(users, {"n_per_group": 12, "n_null": 40, "adapt_background": BACKGROUND}, seed=0)
    assert ch.unit == "user"
    assert all(len({ch.group_of(r) for r in rs}) == 1 for rs in ch._records.values() if rs[0] in ch._group)
    inst = ch.instance(GAMES["adapt"])
    assert len(inst.targets) == 4 * 12  # the four groups, counted in users
    # no held-aside samples in this task: a user shows its own records (user-level membership inference)
    assert all(len(t.samples) == 4 for t in inst.targets)
