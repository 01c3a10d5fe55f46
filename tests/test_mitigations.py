"""Empirical mitigations: per-user limits, clipping, early stopping (Kandpal et al. 2024); goldfish loss and
dedup at pretraining, with their own θ in the runner."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from bench.errors import ConfigError
from bench.game import AdaptationData
from bench.modeling import ModelSpec
from bench.training import _clipped_example_grads, collate, masked_labels, train_causal_lm
from defenses.dedup import Dedup, dedup_texts
from defenses.goldfish import Goldfish, goldfish_mask
from tiny_training import one_thread, tiny_model, tiny_world, word_texts
from defenses.mitigations import EarlyStop, GradientClip, UserLimit, limit_per_user, mean_token_loss

_texts = word_texts
_model = tiny_model
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("bpe"))


class _Recorder:
    """Wraps a model's forward to record every input row it is called on, with the training flag."""

    def __init__(self, model) -> None:
        self.rows: list[tuple[bool, tuple[int, ...]]] = []
        inner = model.forward

        def forward(*args, input_ids=None, attention_mask=None, **kw):
            for r in range(input_ids.shape[0]):
                n = int(attention_mask[r].sum()) if attention_mask is not None else input_ids.shape[1]
                self.rows.append((model.training, tuple(input_ids[r, :n].tolist())))
            return inner(*args, input_ids=input_ids, attention_mask=attention_mask, **kw)

        model.forward = forward


# ----------------------------------------------------------------------------------- user_limit
def test_limit_per_user_keeps_at_most_max_and_is_seeded():
    users = tuple(f"u{i % 7}" for i in range(100)) + ("solo",)
    keep = limit_per_user(users, 5, seed=1)
    counts: dict[str, int] = {}
    for i in keep:
        counts[users[i]] = counts.get(users[i], 0) + 1
    assert set(counts) == set(users) and max(counts.values()) == 5 and counts["solo"] == 1
    assert keep == limit_per_user(users, 5, seed=1)           # seeded: same choice
    assert keep != limit_per_user(users, 5, seed=2)           # another seed, another choice
    assert limit_per_user(users, 1000, seed=1) == list(range(len(users)))  # under the limit: everything


def test_user_limit_trains_only_on_kept_records_and_needs_owners(world):
    texts = tuple(_texts(40, 3))
    users = tuple(f"u{i % 4}" for i in range(40))
    d = UserLimit(max_per_user=3, epochs=1.0, batch_size=4)
    model = _model(world)
    rec = _Recorder(model)
    result = d.adapt(model, AdaptationData(texts, users=users), world["ctx"])
    kept = [texts[i] for i in limit_per_user(users, 3, world["ctx"].seed)]
    allowed = {tuple(s) for s in world["ctx"].encode(kept, d.chunk_length)}
    seen = {row for _, row in rec.rows}
    assert seen == allowed and len(allowed) == 12
    assert result.report["records_kept"] == 12
    with pytest.raises(ConfigError, match="AdaptationData.users"):
        UserLimit().adapt(_model(world), AdaptationData(texts), world["ctx"])


# ----------------------------------------------------------------------------------- clipping
def _batch(world, n=6):
    seqs = world["ctx"].encode(_texts(n, 5, 10, 30), 64)
    return collate(seqs, world["ctx"].pad_id)


def test_per_example_clipping_against_independent_per_record_gradients(world):
    ids, mask, labels = _batch(world)
    model = _model(world).train()
    params = [p for p in model.parameters() if p.requires_grad]
    # independent: one plain backward per record through the loss written out from the logits
    per = []
    for r in range(ids.shape[0]):
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids[r:r + 1], attention_mask=mask[r:r + 1]).logits[0, :-1]
        tgt = labels[r, 1:]
        keep = tgt != -100
        torch.nn.functional.cross_entropy(logits[keep], tgt[keep]).backward()
        per.append([p.grad.detach().clone() for p in params])
    norms = [float(torch.sqrt(sum(g.square().sum() for g in gs))) for gs in per]
    clip = 0.5 * min(norms)  # every record is clipped
    expected = [sum(gs[j] * min(1.0, clip / (n + 1e-6)) for gs, n in zip(per, norms)) / len(per)
                for j in range(len(params))]
    model.zero_grad(set_to_none=True)
    _clipped_example_grads(model, params, ids, mask, labels, clip, torch.autocast("cpu", enabled=False))
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-7)
    # each clipped record has norm <= C, so their mean has norm <= C; unclipped the mean is far larger
    total = float(torch.sqrt(sum(p.grad.square().sum() for p in params)))
    assert total <= clip * (1 + 1e-5)
    assert float(torch.sqrt(sum((sum(gs[j] for gs in per) / len(per)).square().sum()
                                for j in range(len(params))))) > clip


@pytest.mark.parametrize("mode", ["batch", "example"])
def test_clip_defense_bounds_every_update_gradient(world, monkeypatch, mode):
    seen: list[float] = []
    orig = torch.optim.AdamW.step

    def step(self, *a, **kw):
        seen.append(float(torch.sqrt(sum(p.grad.square().sum() for g in self.param_groups for p in g["params"]
                                         if p.grad is not None))))
        return orig(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    d = GradientClip(mode=mode, max_grad_norm=0.05, epochs=1.0, batch_size=6)
    d.adapt(_model(world), AdaptationData(tuple(_texts(24, 6))), world["ctx"])
    assert len(seen) == 4 and max(seen) <= 0.05 * (1 + 1e-4)
    # without clipping the same steps have gradients far above C: the clip was active
    seen.clear()
    GradientClip(mode="batch", max_grad_norm=1e6, epochs=1.0, batch_size=6).adapt(
        _model(world), AdaptationData(tuple(_texts(24, 6))), world["ctx"])
    assert min(seen) > 0.5


# ----------------------------------------------------------------------------------- early stopping
def test_early_stop_trains_on_all_its_data_and_validates_on_held_back_records(world):
    own = tuple(_texts(32, 8))
    held_back = tuple(_texts(8, 42))  # the data owner's validation records: never trained on
    evaluation = _texts(20, 99)  # the benchmark's texts: the defense must never see them
    d = EarlyStop(epochs=40.0, lr=2e-2, batch_size=4, eval_interval=2, patience=2)
    model = _model(world)
    rec = _Recorder(model)
    result = d.adapt(model, AdaptationData(own, validation=held_back), world["ctx"])
    out, rep = result.model, result.report
    ctx = world["ctx"]
    enc = lambda ts: {tuple(s) for s in ctx.encode(ts, d.chunk_length)}  # noqa: E731
    train_rows = {row for training, row in rec.rows if training}
    eval_rows = {row for training, row in rec.rows if not training}
    assert train_rows == enc(own)           # every training record is trained on: no b = 1 target is dropped
    assert eval_rows == enc(held_back)      # validation only on the held-back records
    assert not ((train_rows | eval_rows) & enc(evaluation))
    assert rep["records_val"] == 8 and rep["records_train"] == 32
    planned = 40 * 32 // 4
    assert rep["stopped_at"] is not None and rep["train"]["steps"] < planned  # it stopped early
    losses = [v for _, v in rep["val_history"]]
    assert rep["best_val_loss"] == pytest.approx(min(losses), abs=1e-5)
    val = ctx.encode(list(held_back), d.chunk_length)
    assert mean_token_loss(out, val, ctx.pad_id, ctx.device) == pytest.approx(rep["best_val_loss"], abs=1e-4)
    with pytest.raises(ConfigError, match="world.n_validation"):
        d.adapt(_model(world), AdaptationData(own), world["ctx"])


def test_early_stop_scores_the_last_weights_under_the_last_steps_number(world):
    """A run that ends between two checks validates its last weights too, and its report names that step: 32
    records in batches of 4 for one epoch are 8 steps, checked every 3 steps."""
    d = EarlyStop(epochs=1.0, lr=2e-2, batch_size=4, eval_interval=3, patience=100)
    rep = d.adapt(_model(world), AdaptationData(tuple(_texts(32, 8)), validation=tuple(_texts(8, 42))),
                  world["ctx"]).report
    assert rep["train"]["steps"] == 8 and rep["stopped_at"] is None
    assert [step for step, _ in rep["val_history"]] == [0, 3, 6, 8]
    assert rep["best_step"] <= 8


def test_only_a_validating_defense_sees_held_back_data_in_its_cache_key():
    import dataclasses
    base = AdaptationData(("a", "b"))
    with_val = dataclasses.replace(base, validation=("c",))
    assert base.key_parts() != with_val.key_parts()
    assert dataclasses.replace(with_val, validation=None).key_parts() == base.key_parts()
    assert getattr(EarlyStop, "uses_validation", False) and not getattr(GradientClip, "uses_validation", False)


# ----------------------------------------------------------------------------------- goldfish
@pytest.mark.parametrize("k", [3, 4])
def test_goldfish_drops_about_one_in_k_and_keeps_the_first_h(k):
    ids = torch.randint(0, 5000, (64, 400), generator=torch.Generator().manual_seed(k))
    keep = goldfish_mask(ids, k=k, h=13)
    assert keep[:, :13].all()
    dropped = float((~keep[:, 13:]).float().mean())
    n = keep[:, 13:].numel()
    assert abs(dropped - 1 / k) < 4 * np.sqrt((1 / k) * (1 - 1 / k) / n)


def test_goldfish_decision_depends_only_on_the_preceding_h_tokens():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (32, 200), generator=g)
    ids[:, 100:120] = ids[0, 100:120]  # the same 20-token passage in every row, after different contexts
    keep = goldfish_mask(ids, k=4, h=13)
    assert (keep[:, 113:121] == keep[0, 113:121]).all()  # same 13-gram before -> same decision
    # a map from each 13-gram to its decision is a function (small vocab: many repeats across rows)
    table: dict[tuple, bool] = {}
    for r in range(ids.shape[0]):
        for i in range(13, ids.shape[1]):
            w = tuple(ids[r, i - 13:i].tolist())
            assert table.setdefault(w, bool(keep[r, i])) == bool(keep[r, i])
    # changing a token outside the window changes nothing; inside it, the decision can change
    other = ids.clone()
    other[:, 50] = (other[:, 50] + 1) % 50
    assert torch.equal(goldfish_mask(other, 4, 13)[:, 64:], keep[:, 64:])


def test_goldfish_loss_ignores_dropped_tokens(world):
    ids, mask, labels = _batch(world)
    model = _model(world).eval()
    keep = goldfish_mask(ids, k=2, h=3)
    assert (~keep[:, 3:] & (mask[:, 3:] == 1)).any()
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, labels=masked_labels(labels, keep)).loss
        logits = model(input_ids=ids, attention_mask=mask).logits
    # independent: mean over real, kept next tokens of -log softmax
    lp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    sel = (mask[:, 1:] == 1) & keep[:, 1:]
    assert float(got) == pytest.approx(float(-(lp[sel]).mean()), rel=1e-5)


def test_goldfish_hook_reaches_the_training_loop(world):
    """train_causal_lm with the goldfish hook: the loss it reports is the masked loss of that batch."""
    seqs = world["ctx"].encode(_texts(4, 12, 20, 30), 64)
    d = Goldfish(k=2, h=2)
    a, b = _model(world), _model(world)
    stats = train_causal_lm(a, seqs, epochs=1.0, lr=1e-12, batch_size=4, seed=0, pad_id=world["ctx"].pad_id,
                            loss_mask=d.pretrain_loss_mask, progress=False)
    ids, mask, labels = collate([seqs[i] for i in torch.randperm(4, generator=torch.Generator().manual_seed(0))],
                                world["ctx"].pad_id)
    with torch.no_grad():
        want = b(input_ids=ids, attention_mask=mask, labels=masked_labels(labels, d.pretrain_loss_mask(ids))).loss
        plain = b(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert stats.final_loss == pytest.approx(float(want), rel=1e-5) and float(want) != pytest.approx(float(plain))


# ----------------------------------------------------------------------------------- dedup
def test_dedup_removes_exact_and_near_duplicates_and_keeps_singletons():
    long = " ".join(_texts(1, 21, 60, 60))
    near = long.split()
    near[30] = "zebra"  # one word changed: 13-gram containment stays high
    docs = [long, "A short singleton.", long.upper().replace(" ", "  "), " ".join(near),
            "Another singleton with words.", "a short singleton.", " ".join(_texts(1, 22, 60, 60))]
    keep, counts = dedup_texts(docs, ngram=13, near_threshold=0.5)
    assert keep == [0, 1, 4, 6]
    assert counts == {"exact_removed": 2, "near_removed": 1, "kept": 4}


def test_dedup_hook_removes_repeated_inserts():
    corpus = _texts(30, 30, 20, 30)
    targets = _texts(5, 31, 20, 30)
    from bench.artifacts import filter_pretraining
    kept_c, kept_i, report = filter_pretraining(Dedup(), corpus, targets * 3)
    assert sorted(kept_c) == sorted(corpus) and sorted(kept_i) == sorted(targets)
    assert report["inserts_in"] == 15 and report["inserts_kept"] == 5 and report["exact_removed"] == 10


def test_dedup_of_the_adaptation_data_trains_each_repeated_record_once(world):
    """adapt_dedup: a canary inserted three times is trained on in one copy, every distinct record still is, and
    the report counts what went; without it the recipe is plain fine-tuning on every copy."""
    distinct = _texts(12, 33)
    repeated = distinct[:4] * 3 + distinct[4:]  # four records inserted three times
    ctx = world["ctx"]
    enc = lambda ts: [tuple(r) for r in ctx.encode(ts, 128)]  # noqa: E731
    for adapt_dedup, copies in ((True, 1), (False, 3)):
        model = _model(world)
        rec = _Recorder(model)
        d = Dedup(adapt_dedup=adapt_dedup, epochs=1.0, batch_size=4)
        result = d.adapt(model, AdaptationData(tuple(repeated)), ctx)
        trained = [row for training, row in rec.rows if training]
        assert {row: trained.count(row) for row in enc(distinct[:4])} == dict.fromkeys(enc(distinct[:4]), copies)
        assert set(trained) == set(enc(distinct))
        if adapt_dedup:
            assert result.report["adapt_dedup"] == {"records_in": 20, "exact_removed": 8, "near_removed": 0,
                                                    "kept": 12}
        else:
            assert "adapt_dedup" not in result.report


# ----------------------------------------------------------------------------------- own θ per defense
def test_pretrain_stage_defenses_get_their_own_theta_and_undefended_key_is_unchanged(cache):
    import json

    from bench.artifacts import TRAINING_CODE, ensure_pretrained, ensure_tokenizer, pretrain_fingerprint
    from bench.hashing import CACHE_SCHEMA, content_hash, module_hash, text_hash
    from bench.registry import TASKS

    data = TASKS.create("mini_pile", {"max_chars_per_source": 400_000}).build(cache)
    spec = ModelSpec("nano", pretrain_tokens=4000)
    tok = ensure_tokenizer(cache, spec, data)
    inserts = list(data.pretrain[-3:]) * 2
    dev = torch.device("cpu")
    path0, key0 = ensure_pretrained(cache, spec, data, tok, inserts, 0, dev, progress=False)
    # the undefended key is the formula it always was (independently recomputed here)
    assert key0 == content_hash("pretrained", CACHE_SCHEMA, module_hash(*TRAINING_CODE), spec.arch_dict(),
                                spec.pretrain_tokens, spec.pretrain_epochs, spec.pretrain_lr,
                                spec.pretrain_batch_size, spec.autocast_bf16, tok[1], pretrain_fingerprint(data),
                                sorted(text_hash(t) for t in inserts), 0)
    from defenses.finetune import FineTune
    assert ensure_pretrained(cache, spec, data, tok, inserts, 0, dev, defense=FineTune(), progress=False)[1] == key0
    pd, kd = ensure_pretrained(cache, spec, data, tok, inserts, 0, dev, defense=Dedup(), progress=False)
    pg, kg = ensure_pretrained(cache, spec, data, tok, inserts, 0, dev, defense=Goldfish(), progress=False)
    pg2, _ = ensure_pretrained(cache, spec, data, tok, inserts, 0, dev, defense=Goldfish(k=3), progress=False)
    assert len({key0, kd, kg, pg2.name}) == 4
    meta_d = json.loads((pd / "privbench.json").read_text())["pretrain_defense"]
    assert meta_d["inserts_kept"] == 3 and meta_d["exact_removed"] >= 3
    meta_0 = json.loads((path0 / "privbench.json").read_text())
    assert "pretrain_defense" not in meta_0
    from safetensors.torch import load_file
    w0, wg = load_file(str(path0 / "model.safetensors")), load_file(str(pg / "model.safetensors"))
    assert any(not torch.equal(w0[k], wg[k]) for k in w0)  # goldfish trained a different θ


def test_runner_scores_pretrain_game_on_each_defenses_own_theta(cache, tmp_path):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    suite = parse_suite({
        "name": "tiny-mitigations", "seeds": [0],
        "tasks": [{"name": "mini_pile", "params": {"max_chars_per_source": 400_000}}],
        "models": [{"name": "nano", "params": {"pretrain_tokens": 6000, "reference_tokens": 4000}}],
        "defenses": [{"name": "finetune", "params": {"epochs": 1}}, {"name": "goldfish", "params": {"epochs": 1}}],
        "attacks": ["loss"], "games": ["pretrain", "post_adapt"],
        "world": {"n_per_group": 8, "n_null": 16, "adapt_background": 8, "pretrain_target_repeats": 2},
        "reference": False, "metrics": {"n_boot": 50}, "utility": {"n_heldout": 20},
    })
    store = Store(str(tmp_path / "r.db"))
    result = Runner(suite, store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 4
    pre = {(r["defense"]) for r in store.utility_rows(result.run_id) if r["role"] == "pretrained"}
    assert pre == {"-", "goldfish"}
    rows = [r for r in store.metric_rows(result.run_id) if r["game"] == "pretrain" and r["metric"] == "auc"]
    by_def = {r["defense"]: r["value"] for r in rows}
    assert set(by_def) == {"finetune", "goldfish"} and by_def["finetune"] != by_def["goldfish"]
