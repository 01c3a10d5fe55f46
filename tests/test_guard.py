"""GUARD and pure KD: anchored target, losses, a tiny training run, the runner.

GUARD is Algorithm 1 of GUARD (anonymous preprint, 2025), pure KD its appendix A.3.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from bench.defense import TrainContext
from bench.errors import ConfigError
from bench.game import AdaptationData
from bench.modeling import ModelSpec, build_scratch_model
from bench.tokenizer import train_bpe_tokenizer
from bench.training import collate, train_causal_lm
from defenses.guard import Guard, KnowledgeDistillation, anchored_target, guard_loss, kd_loss


# ----------------------------------------------------------------------------------- anchored target
def _np_anchored(p0: np.ndarray, pft: np.ndarray, y: int, k: int) -> np.ndarray:
    """Algorithm 1 lines 9–12, one row, written from the paper with plain numpy."""
    s = set(np.argsort(-p0, kind="stable")[:k]) | set(np.argsort(-pft, kind="stable")[:k]) | {y}
    rest = sorted(s - {y})
    r = sorted(rest, key=lambda w: -pft[w])          # teacher order
    b = sorted((p0[w] for w in rest), reverse=True)  # base magnitudes
    q = np.zeros_like(p0)
    q[y] = p0[y]
    for w, val in zip(r, b):
        q[w] = val
    left = 1.0 - sum(q[w] for w in s)
    for w in rest:
        q[w] += left / len(rest)
    return q


def _toy(n: int, v: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p0 = rng.dirichlet(np.full(v, 0.3), size=n)
    pft = rng.dirichlet(np.full(v, 0.3), size=n)
    gold = rng.integers(0, v, size=n)
    return p0, pft, gold


@pytest.mark.parametrize("k", [2, 3, 5, 40])
def test_anchored_target_matches_numpy_and_the_papers_properties(k):
    p0, pft, gold = _toy(64, 17, k)
    q = anchored_target(torch.tensor(p0), torch.tensor(pft), torch.tensor(gold), k).numpy()
    for i in range(len(p0)):
        ref = _np_anchored(p0[i], pft[i], int(gold[i]), k)
        np.testing.assert_allclose(q[i], ref, rtol=0, atol=1e-12)
        y = gold[i]
        assert q[i, y] == pytest.approx(p0[i, y], abs=1e-15)       # gold keeps its pretrained probability
        assert q[i].sum() == pytest.approx(1.0, abs=1e-12)
        s = set(np.argsort(-p0[i])[:k]) | set(np.argsort(-pft[i])[:k]) | {y}
        assert set(np.flatnonzero(q[i] > 0)) <= s                    # support within the top-K union
        rest = np.array(sorted(s - {y}))
        assert len(rest) <= 2 * k
        # non-gold order follows the teacher, and magnitudes are the pretrained ones (up to one constant)
        by_teacher = rest[np.argsort(-pft[i, rest], kind="stable")]
        assert np.all(np.diff(q[i, by_teacher]) <= 1e-15)
        const = (1.0 - p0[i, list(s)].sum()) / len(rest)  # the remaining base mass, spread uniformly
        np.testing.assert_allclose(np.sort(q[i, rest] - const), np.sort(p0[i, rest]), atol=1e-12)


def test_anchored_target_batches_over_leading_dims_and_k_covering_the_vocabulary():
    p0, pft, gold = _toy(12, 9, 1)
    q = anchored_target(torch.tensor(p0).view(3, 4, 9), torch.tensor(pft).view(3, 4, 9), torch.tensor(gold).view(3, 4),
                        100)
    assert q.shape == (3, 4, 9)
    flat = q.reshape(12, 9).numpy()
    for i in range(12):  # K ≥ V: every token kept, nothing left to spread
        np.testing.assert_allclose(flat[i], _np_anchored(p0[i], pft[i], int(gold[i]), 9), atol=1e-12)
        np.testing.assert_allclose(np.sort(flat[i]), np.sort(p0[i]), atol=1e-12)  # a permutation of p_0


# ----------------------------------------------------------------------------------- losses
def _np_softmax(z: np.ndarray, tau: float) -> np.ndarray:
    z = z / tau
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("tau,lam", [(1.0, 0.5), (2.0, 0.0), (0.7, 3.0)])
def test_guard_and_kd_losses_match_an_independent_computation(tau, lam):
    rng = np.random.default_rng(3)
    b, t, v = 2, 5, 11
    logits = rng.normal(size=(b, t, v)) * 2
    p0, pft, gold = _toy(b * t, v, 4)
    q = np.stack([_np_anchored(p0[i], pft[i], int(gold[i]), 3) for i in range(b * t)]).reshape(b, t, v)
    gold = gold.reshape(b, t)
    w = np.ones((b, t))
    w[1, 3:] = 0  # padding
    s = _np_softmax(logits, tau)
    per = np.zeros((b, t))
    for i in range(b):
        for j in range(t):
            nz = q[i, j] > 0
            kl = float(np.sum(q[i, j][nz] * np.log(q[i, j][nz] / s[i, j][nz])))
            g = int(gold[i, j])
            per[i, j] = tau ** 2 * kl + lam * (s[i, j, g] - p0.reshape(b, t, v)[i, j, g]) ** 2
    ref = float((per * w).sum() / w.sum())
    got = guard_loss(torch.tensor(logits), torch.tensor(q), torch.tensor(gold),
                     torch.tensor(np.take_along_axis(p0.reshape(b, t, v), gold[..., None], -1)[..., 0]),
                     torch.tensor(w), tau=tau, lam=lam)
    assert float(got) == pytest.approx(ref, rel=1e-6)
    pt = pft.reshape(b, t, v)
    kd_ref = float(((tau ** 2 * (pt * np.log(pt / s)).sum(-1)) * w).sum() / w.sum())
    assert float(kd_loss(torch.tensor(logits), torch.tensor(pt), torch.tensor(w), tau=tau)) == pytest.approx(kd_ref,
                                                                                                           rel=1e-6)


def test_parameters_are_validated():
    with pytest.raises(ConfigError):
        Guard(top_k=1)
    with pytest.raises(ConfigError):
        Guard(gold_weight=-0.1)
    with pytest.raises(ConfigError):
        KnowledgeDistillation(temperature=0)
    with pytest.raises(ConfigError):
        Guard(teacher_lr=0)
    assert Guard().gold_weight == 0.5 and Guard().top_k == 1000 and Guard().temperature == 1.0


# ----------------------------------------------------------------------------------- a tiny training run
WORDS = ("alpha beta gamma delta river stone cloud market doctor patient record street garden window "
         "letter number seven eleven blue green quiet rapid north south paper table").split()


def _texts(n: int, seed: int, codes: bool = False) -> list[str]:
    """Word salad; with ``codes`` each text also carries random digit strings, which only memorisation predicts."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 14))]
        if codes:
            for _ in range(3):
                words.insert(rng.randrange(len(words)), str(rng.randrange(10 ** 5, 10 ** 6)))
        out.append(" ".join(words) + ".")
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tok_dir = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(_texts(300, 0, codes=True), tok_dir, vocab_size=256)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=64)
    ctx = TrainContext(tok, torch.device("cpu"), 64, seed=0, autocast_bf16=False, progress=False)
    base = build_scratch_model(spec, tok, 0)  # θ: pretrained on public text of the same kind
    train_causal_lm(base, ctx.encode(_texts(300, 0, codes=True)), epochs=2, lr=3e-3, batch_size=16, seed=0,
                    pad_id=ctx.pad_id, progress=False)
    members, others = _texts(32, 1, codes=True), _texts(32, 2, codes=True)
    return {"ctx": ctx, "base": base, "members": members, "others": others}


def _record_losses(model, ctx, texts) -> np.ndarray:
    from defenses.dp import record_losses
    ids, mask, _ = collate(ctx.encode(texts), ctx.pad_id)
    with torch.no_grad():
        return record_losses(model(input_ids=ids, attention_mask=mask).logits, ids, mask).numpy()


def _auc(members: np.ndarray, others: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score([1] * len(members) + [0] * len(others), np.concatenate([-members, -others])))


def test_guard_student_keeps_the_gold_token_near_theta_and_hides_membership(world):
    ctx, base = world["ctx"], world["base"]
    data = AdaptationData(tuple(world["members"]))
    common = dict(epochs=3.0, lr=3e-3, batch_size=8, chunk_length=64, teacher_epochs=20.0, teacher_lr=3e-3,
                  teacher_batch_size=8)
    teacher = copy.deepcopy(base)
    from defenses.finetune import FineTune
    FineTune(epochs=20.0, lr=3e-3, batch_size=8, chunk_length=64).adapt(teacher, data, ctx)
    guard = Guard(top_k=50, **common).adapt(copy.deepcopy(base), data, ctx).model
    kd = KnowledgeDistillation(**common).adapt(copy.deepcopy(base), data, ctx).model
    loss = {name: (_record_losses(m, ctx, world["members"]), _record_losses(m, ctx, world["others"]))
            for name, m in (("base", base), ("teacher", teacher), ("guard", guard), ("kd", kd))}
    mem = {k: float(v[0].mean()) for k, v in loss.items()}
    auc = {k: _auc(*v) for k, v in loss.items()}
    # the teacher memorised its data; GUARD's student does not lower the members' loss the way the teacher does
    assert mem["teacher"] < mem["base"] - 0.5
    assert mem["guard"] > mem["teacher"] + 0.5
    assert abs(mem["guard"] - mem["base"]) < 0.5 * abs(mem["teacher"] - mem["base"])
    # the GUARD paper's direction: the Loss attack is strong on the teacher and on pure KD, near chance on GUARD
    # (measured: teacher 0.93, kd 0.66, guard 0.51 on this seed)
    assert auc["teacher"] > 0.85 and auc["kd"] > auc["guard"] + 0.08
    assert abs(auc["guard"] - 0.5) < 0.1


# ----------------------------------------------------------------------------------- through the runner
def test_guard_and_kd_run_through_the_runner(cache, tmp_path):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    raw = {
        "name": "tiny-guard", "seeds": [0],
        "tasks": [{"name": "mini_pile", "params": {"max_chars_per_source": 400_000}}],
        "models": [{"name": "nano", "params": {"pretrain_tokens": 6000, "reference_tokens": 4000}}],
        "defenses": [{"name": "guard", "params": {"epochs": 1, "teacher_epochs": 1, "top_k": 64}},
                     {"name": "kd", "params": {"epochs": 1, "teacher_epochs": 1}}],
        "attacks": ["loss", "min_k"], "games": ["adapt", "null"],
        "world": {"n_per_group": 8, "n_null": 16, "adapt_background": 8},
        "metrics": {"n_boot": 50}, "utility": {"n_heldout": 20},
    }
    store = Store(str(tmp_path / "r.db"))
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 8
    rows = store.metric_rows(result.run_id)
    assert {r["defense"] for r in rows} == {"guard", "kd"}
    roles = {(r["defense"], r["role"]) for r in store.utility_rows(result.run_id)}
    assert {("guard", "adapted"), ("kd", "adapted")} <= roles
