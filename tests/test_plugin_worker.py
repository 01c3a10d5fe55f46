"""The attacker view crossing to a submitted attack's worker (bench/plugin_worker.py), without the processes.

`view_spec` turns the view into data and handles on the child's side; the worker's `_view` rebuilds it with
models whose calls come back to those handles. Here the pipe is a function that pickles the answer, so the test
checks the plumbing every attack relies on (targets, population, public format, shadows, the trainer, errors)
in milliseconds; tests/test_submit.py runs real workers.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fakes import UnigramLM, make_texts  # noqa: E402

from bench.attacker_models import ReferenceTrainer  # noqa: E402
from bench.errors import CapabilityError, PluginError  # noqa: E402
from bench.game import AttackerView, ShadowSet, Target  # noqa: E402
from bench.lm import GENERATE, TOKEN_LOGPROBS, RestrictedModel  # noqa: E402
from bench.plugin_worker import _view, serve_call, view_spec  # noqa: E402


def _through_a_pipe(handles):
    """The worker's rpc, with the child's answer (or error) pickled as the real pipe carries it."""
    def rpc(handle, method, args):
        try:
            value = serve_call({"id": handle, "method": method, "args": args}, handles)
        except (CapabilityError, PluginError) as exc:
            raise type(exc)(str(exc)) from None
        return pickle.loads(pickle.dumps(value))
    return rpc


def test_the_view_arrives_whole_and_model_calls_run_on_the_childs_handles():
    texts = make_texts(6, seed=1)
    released = UnigramLM(texts[:3], name="released")
    trained: list[tuple] = []

    def finetune(texts_, epochs, lr, batch_size, seed):
        trained.append((tuple(texts_), epochs, lr, batch_size, seed))
        return RestrictedModel(UnigramLM(texts_, name="self-trained"), frozenset({TOKEN_LOGPROBS}), "self-trained")

    shadows = ShadowSet((RestrictedModel(UnigramLM(texts[3:], name="s0"), frozenset({TOKEN_LOGPROBS}), "shadow"),),
                        (tuple(texts[3:]),), tuple(texts[:2]), "attacker reference")
    view = AttackerView("adapt", tuple(Target(f"t{i}", t, (t, t + "!")) for i, t in enumerate(texts)),
                        RestrictedModel(released, frozenset({TOKEN_LOGPROBS}), "adapted"), None, None,
                        tuple(texts[:2]), shadows, {"kind": "prose"}, "user",
                        ReferenceTrainer("released θ", finetune))
    handles: dict = {}
    spec = pickle.loads(pickle.dumps(view_spec(view, handles)))   # what the worker receives
    remote = _view(spec, _through_a_pipe(handles))

    assert [(t.id, t.text, t.samples) for t in remote.targets] == [(t.id, t.text, t.samples) for t in view.targets]
    assert remote.population == view.population and remote.public_format == {"kind": "prose"}
    assert (remote.game, remote.unit, remote.base, remote.reference) == ("adapt", "user", None, None)
    assert remote.model.fingerprint == released.fingerprint and remote.model.capabilities == {TOKEN_LOGPROBS}
    ours, theirs = view.model.token_signals(texts), remote.model.token_signals(texts)
    assert all(np.array_equal(a.logprobs, b.logprobs) for a, b in zip(ours, theirs))
    assert remote.shadows.members == shadows.members and remote.shadows.held_out == shadows.held_out
    assert remote.shadows.models[0].fingerprint == shadows.models[0].fingerprint
    assert remote.trainer.start == "released θ"
    tuned = remote.trainer.finetune(texts[:2], epochs=1, lr=0.1, batch_size=4, seed=3)
    assert trained == [(tuple(texts[:2]), 1.0, 0.1, 4, 3)] and tuned.capabilities == {TOKEN_LOGPROBS}
    assert tuned.nll(texts[:1]).shape == (1,)
    # an undeclared capability is refused by the child's handle, as the same error class in the worker
    with pytest.raises(CapabilityError, match="does not release 'generate'"):
        remote.model.generate(["x"], 2)
    assert GENERATE not in remote.model.capabilities


def test_a_worker_names_only_handles_and_methods_it_was_given():
    handles = {0: RestrictedModel(UnigramLM(["a"]), frozenset({TOKEN_LOGPROBS}), "adapted")}
    for call in ({"id": 7, "method": "token_signals", "args": [["x"], None]},
                 {"id": "0", "method": "token_signals", "args": []},
                 {"id": 0, "method": "_call", "args": ["token_signals", ["x"]]},
                 {"id": 0, "method": "finetune", "args": [["x"], 1, 0.1, 4, 0]},
                 {"id": 0, "method": "token_signals", "args": "x"}):
        with pytest.raises(PluginError):
            serve_call(call, handles)


def test_a_defenses_pretraining_hooks_run_in_real_workers(tmp_path):
    """The stand-in the submission child registers for a pretraining-stage defense: described by one worker,
    each hook answered by a worker that imported the plugin (the child never does)."""
    import torch

    from bench.defense import Defense
    from bench.plugin_ref import resolve_plugin
    from bench.plugin_worker import WorkerIsolation, WorkerSession, worker_defense

    plugin = resolve_plugin(str(Path(__file__).parent / "plugins" / "mask_defense.py"))
    box = tmp_path / "box"
    box.mkdir()
    with WorkerSession(plugin, box, box / "violation.json", WorkerIsolation()) as w:
        info = w.info
    assert (info["kind"], info["name"], info["stages"], info["loss_mask"]) == (
        "defense", "even_tokens", ["adapt", "pretrain"], True)
    defense = worker_defense(plugin, info, box, box / "violation.json", WorkerIsolation())()
    assert "privbench_submitted_" + plugin.code_hash not in sys.modules  # the plugin was imported in workers only
    kept = defense.pretrain_texts(["a b", "x y", "c"])
    assert (kept.docs, kept.report) == (["a b", "c"], {"dropped": 1})
    assert type(defense).pretrain_loss_mask is not Defense.pretrain_loss_mask  # the runner passes it to training
    ids = torch.arange(12).reshape(2, 6)
    assert defense.pretrain_loss_mask(ids).tolist() == (ids % 2 == 0).tolist()
    assert defense.pretrain_loss_mask(ids + 1).tolist() == ((ids + 1) % 2 == 0).tolist()  # same worker, next batch


def test_a_session_starts_its_worker_at_once_and_reports_a_failed_load_when_asked(tmp_path):
    """The submission child starts the describing worker and does its own imports while that one loads: the
    first request is on the pipe when the session is made, and the load's failure is raised by ``info`` (the
    session is then closed, and leaving ``with`` closes nothing twice)."""
    from bench.plugin_ref import resolve_plugin
    from bench.plugin_worker import WorkerIsolation, WorkerSession
    from bench.sandbox import FAILURE_EXIT

    src = tmp_path / "broken_defense.py"
    src.write_text("raise ImportError('no module named hidden_helper')\n")
    plugin = resolve_plugin(str(src))
    box = tmp_path / "box"
    box.mkdir()
    with pytest.raises(PluginError, match="hidden_helper"):
        with WorkerSession(plugin, box, box / "violation.json", WorkerIsolation()) as w:
            # the worker got its request with the session: it loads the plugin, fails and ends, unasked
            assert w.proc.wait(timeout=120) == FAILURE_EXIT
            w.info
    assert w._closed and w.proc.poll() is not None and not w.dir.exists()


def test_a_workers_calls_neither_read_nor_fill_the_runners_signal_cache(tmp_path):
    """The cache-timing channel: an attack that scores its targets under a marker prefix in one game, and in a
    later game times the same calls (a cache hit answers at once, a miss runs the model), would learn which of
    its targets the earlier game showed it. A worker's calls go to a private-cache twin of each handle
    (tests/plugins/cache_timing_attack.py is that attack, run end to end in tests/test_submit.py)."""
    from tiny_training import tiny_model, tiny_world, word_texts

    from bench.lm import HFLanguageModel, SignalCache

    world = tiny_world(tmp_path / "bpe")
    shared = SignalCache(tmp_path / "signals")
    lm = HFLanguageModel(tiny_model(world), world["tok"], fingerprint="m", max_length=64, batch_size=4,
                         cache=shared)
    texts = word_texts(6, 3)
    runner_scored = lm.token_signals(texts[:3])  # what the runner scored itself, before any attack
    shards = sorted((tmp_path / "signals").rglob("*.npz"))

    def game_view(game: str) -> AttackerView:
        return AttackerView(game, tuple(Target(f"t{i}", t) for i, t in enumerate(texts)),
                            RestrictedModel(lm, frozenset({TOKEN_LOGPROBS}), "adapted"), None, None, None)

    computed: list[int] = []
    compute = HFLanguageModel._compute_signals

    def counting(self, keys, texts_, prefix=None):
        computed.append(len(keys))
        return compute(self, keys, texts_, prefix)

    HFLanguageModel._compute_signals = counting
    try:
        first: dict = {}
        remote = _view(pickle.loads(pickle.dumps(view_spec(game_view("adapt"), first))), _through_a_pipe(first))
        marked = remote.model.token_signals(texts[3:], prefix="adapt->joint")
        again = remote.model.token_signals(texts[3:], prefix="adapt->joint")  # within one game: its own cache
        assert computed == [3]
        second: dict = {}
        later = _view(pickle.loads(pickle.dumps(view_spec(game_view("joint"), second))), _through_a_pipe(second))
        probe = later.model.token_signals(texts[3:], prefix="adapt->joint")
        plain = later.model.token_signals(texts[:3])
    finally:
        HFLanguageModel._compute_signals = compute
    # the later game ran the model for the marked texts (a miss, as if never asked) and for texts the runner had
    # scored (its cache is not read either): nothing a call's speed could tell apart
    assert computed == [3, 3, 3]
    assert sorted((tmp_path / "signals").rglob("*.npz")) == shards  # nothing added to the shared cache
    for a, b in zip(marked + plain, probe + runner_scored):
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert all(np.array_equal(a.logprobs, b.logprobs) for a, b in zip(marked, again))


def test_a_failed_plugin_call_names_the_plugins_own_line(tmp_path):
    import importlib.util

    from bench.plugin_worker import _plugin_frame, _plugin_source
    (tmp_path / "plug.py").write_text("import json\n\nclass P:\n    def go(self):\n        return json.loads('{')\n")
    spec = importlib.util.spec_from_file_location("plug_under_test", tmp_path / "plug.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # as bench.plugin_ref.load_plugin registers a plugin's module
    spec.loader.exec_module(mod)
    try:
        mod.P().go()
    except ValueError as exc:
        where = _plugin_source(mod.P)
        # the innermost frame is in the json module; the plugin's own line is the one named
        assert _plugin_frame(exc, where) == " (at plug.py:5 in go)"
        assert _plugin_frame(exc, []) == ""
    finally:
        sys.modules.pop(spec.name, None)
