"""Unit-level DP-SGD (dp_adapt ``unit``): units are formed as the data owner names them, each step clips every
sampled unit's gradient (the mean of its records') as one vector, and the ledger counts units."""

from __future__ import annotations

import math

import pytest
import torch

import defenses.dp as dp_module
from bench.accounting import privacy_units
from bench.defense import TrainContext
from bench.errors import ConfigError
from bench.game import AdaptationData
from defenses.dp import DPAdapt, dp_train, record_losses, train_prefix
from defenses.dp_units import embedding_sq_norms, regroup_tokens
from tiny_training import one_thread, tiny_model, tiny_trainable, tiny_world, word_texts

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("bpe"))


# ------------------------------------------------------------------------------------------- units
def test_privacy_units_follow_owners_secrets_and_identical_texts():
    texts = ["a", "b", "a", "c", "d", "e"]
    users = ["u1", "u2", "u1", "u3", "u2", "u4"]
    assert privacy_units(texts, users, by="user") == ([0, 1, 0, 2, 1, 3], "user")
    assert privacy_units(texts, by="text") == ([0, 1, 0, 2, 3, 4], "text")
    assert privacy_units(texts, by="record") == ([0, 1, 2, 3, 4, 5], "record")
    # s and t share record 2, so their records form one unit; t and r share none with s's unit; record 5 has none
    secrets = [("s",), ("t",), ("s", "t"), ("r",), ("r",), ()]
    assert privacy_units(texts, secrets=secrets, by="secret") == ([0, 0, 0, 1, 1, 2], "secret")
    # a chain: x-y in record 0, y-z in record 2, z in record 4 -> one component found only through record 2
    chain = [("x", "y"), ("w",), ("y", "z"), (), ("z",), ("w",)]
    assert privacy_units(texts, secrets=chain, by="secret") == ([0, 1, 0, 2, 0, 1], "secret")
    # auto: owners first, then secrets (if any record carries one), then identical texts
    assert privacy_units(texts, users, secrets, by="auto")[1] == "user"
    assert privacy_units(texts, None, secrets, by="auto")[1] == "secret"
    assert privacy_units(texts, None, [()] * 6, by="auto") == ([0, 1, 0, 2, 3, 4], "text")


@pytest.mark.parametrize("call,fix", [
    (lambda: privacy_units(["a", "b"], by="user"), "synthetic_users"),
    (lambda: privacy_units(["a", "b"], by="secret"), "synthetic_secrets"),
    (lambda: privacy_units(["a", "b"], users=["u"], by="user"), "align them"),
    (lambda: privacy_units(["a", "b"], by="owner"), "record, user, secret, text, auto"),
])
def test_privacy_units_refuse_what_the_data_does_not_name(call, fix):
    with pytest.raises(ConfigError, match=fix):
        call()


def test_regroup_tokens_lays_each_units_rows_end_to_end():
    x = torch.arange(5 * 3).reshape(5, 3) + 1  # 5 rows of 3 tokens
    row_unit = torch.tensor([0, 0, 1, 2, 2])
    out = regroup_tokens(x, row_unit, 3)
    assert out.shape == (3, 6)  # the largest unit has 2 rows
    assert out[0].tolist() == x[0].tolist() + x[1].tolist()
    assert out[1].tolist() == x[2].tolist() + [0, 0, 0]
    assert out[2].tolist() == x[3].tolist() + x[4].tolist()
    # rows of a unit need not be adjacent: each unit keeps its rows in their order
    mixed = regroup_tokens(x[:3], torch.tensor([1, 0, 1]), 2)
    assert mixed[0].tolist() == x[1].tolist() + [0, 0, 0]
    assert mixed[1].tolist() == x[0].tolist() + x[2].tolist()


# -------------------------------------------------------------------------- the clipped step
N_RECORDS = 30
SIZES = (1, 4, 2, 5, 1, 3, 2, 1, 6, 2, 3)  # records per unit: 30 records, 11 units


def _units() -> list[int]:
    out = [u for u, k in enumerate(SIZES) for _ in range(k)]
    assert len(out) == N_RECORDS
    return out


_build = tiny_trainable


def _expected_update(world, method: str, seqs, units, batch_units: list[int], clip: float, expected: float):
    """The noise-free DP-SGD gradient by definition, one unit at a time with plain autograd: each sampled unit's
    gradient is that of the mean of its records' losses, scaled by min(1, C / (‖g‖ + 1e-6)) (Opacus' flat
    clipping), summed over the units and divided by the expected batch of units."""
    from defenses.dp import _Collate

    model = _build(world, method).train()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for u in batch_units:
        ids, mask = _Collate(world["ctx"].pad_id)([seqs[i] for i in range(len(seqs)) if units[i] == u])
        loss = record_losses(model(input_ids=ids, attention_mask=mask).logits, ids, mask).mean()
        grads = torch.autograd.grad(loss, list(params.values()))
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        coef = min(1.0, clip / (norm + 1e-6))
        for n, g in zip(params, grads):
            total[n] += coef * g
    return {n: t / expected for n, t in total.items()}


@pytest.mark.parametrize("mode,method", [("hooks", "full"), ("functorch", "head"), ("vmap", "full"),
                                         ("vmap", "lora"), ("bk", "full"), ("bk", "head"), ("bk", "lora"),
                                         ("hooks", "lora")])
@pytest.mark.parametrize("clip", [0.01, 100.0])
def test_unit_level_step_equals_clipping_each_units_mean_gradient(world, mode, method, clip, monkeypatch):
    """One DP-SGD step with ``unit`` set, noise 0, against the definition computed unit by unit. At clip 0.01
    every unit is clipped, so clipping records instead of units gives another update; at clip 100 none is, so
    summing a unit's records instead of averaging them does."""
    _check_unit_step(world, mode, method, clip, monkeypatch)


@pytest.mark.parametrize("gram", [True, False])
@pytest.mark.parametrize("clip", [0.01, 100.0])
def test_book_keeping_unit_norms_hold_by_either_formula(world, gram, clip, monkeypatch):
    """Book-keeping takes a Linear layer's unit norms from Gram matrices over the unit's rows laid end to end, or
    from each row's gradient summed per unit, whichever costs fewer flops: each, forced, gives the definition."""
    import defenses.dp_bookkeeping as bk
    monkeypatch.setattr(bk, "_ghost_is_cheaper", lambda *args: gram)
    _check_unit_step(world, "bk", "full", clip, monkeypatch)


def test_embedding_norms_per_unit_equal_the_gram_formula_over_the_units_tokens():
    """The input embedding's unit norm, from (unit, token id) sums, against Σ_{t,s} [x_t = x_s] g_t·g_s over each
    unit's tokens laid end to end: ids repeat within a row, across a unit's rows and across units."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 7, (9, 5), generator=g)
    g_emb = torch.randn(9, 5, 4, generator=g, dtype=torch.float64)
    row_unit = torch.tensor([2, 0, 0, 1, 2, 0, 3, 1, 0])
    got = embedding_sq_norms(ids, g_emb, row_unit, 4)
    x, b = regroup_tokens(ids, row_unit, 4), regroup_tokens(g_emb, row_unit, 4)
    want = ((b @ b.transpose(1, 2)) * (x[:, :, None] == x[:, None, :])).sum((1, 2))
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    # and by brute force: each unit's dense gradient row per vocabulary id
    for u in range(4):
        dense = torch.zeros(7, 4, dtype=torch.float64)
        for r in (row_unit == u).nonzero().flatten().tolist():
            dense.index_add_(0, ids[r], g_emb[r])
        assert float(got[u]) == pytest.approx(float(dense.pow(2).sum()), rel=1e-12)


def _check_unit_step(world, mode: str, method: str, clip: float, monkeypatch) -> None:
    texts = word_texts(N_RECORDS, 3)
    seqs = world["ctx"].encode(texts, 64)
    units = _units()
    fetched: list[list[int]] = []
    grads: dict[str, torch.Tensor] = {}

    class Recorded(dp_module._Records):
        def __getitems__(self, idx):
            fetched.append(list(idx))
            return [self.seqs[i] for i in idx]

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    grads[names[id(p)]] = p.grad.detach().clone()
            return super().step(closure)

    monkeypatch.setattr(dp_module, "_Records", Recorded)
    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    model = _build(world, method)
    names = {id(p): n for n, p in model.named_parameters()}
    batch = 4
    rep = dp_train(model, seqs, pad_id=world["ctx"].pad_id, epsilon=math.inf, noise_multiplier=0.0, delta=1e-5,
                   clip=clip, epochs=1 / 3, lr=1e-3, batch_size=batch, seed=11, grad_sample_mode=mode,
                   units=units, unit="user")
    assert rep["steps"] == 1 and rep["n_units"] == len(SIZES) and rep["n_records"] == N_RECORDS
    (sampled,) = fetched[:1]
    assert len(sampled) >= 2 and any(SIZES[u] > 1 for u in sampled)  # a step with several units, one of many records
    # the loader's items are units in order of first appearance: unit index u is SIZES' u-th unit
    want = _expected_update(world, method, seqs, units, sampled, clip, expected=int(len(SIZES) / 3))
    assert grads.keys() == want.keys() and grads
    scale = max(float(v.abs().max()) for v in want.values())
    for n in want:
        assert torch.allclose(grads[n], want[n], atol=2e-5 * scale, rtol=1e-3), n
    # the norm of the sum is at most (units sampled) x clip / expected batch: each unit contributed <= clip
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in grads.values()))
    assert norm <= len(sampled) * clip / int(len(SIZES) / 3) + 1e-7


def test_prefix_tuning_clips_units_too(world):
    texts = word_texts(N_RECORDS, 3)
    seqs = world["ctx"].encode(texts, 64)
    model, rep = train_prefix(tiny_model(world), seqs, prefix_length=4, pad_id=world["ctx"].pad_id, epsilon=8.0,
                              delta=None, clip=0.1, epochs=1.0, lr=1e-2, batch_size=4, seed=0, units=_units(),
                              unit="user")
    assert rep["n_units"] == len(SIZES) and rep["ledger"]["unit"] == "user"
    assert rep["ledger"]["delta"] == pytest.approx(1 / (2 * len(SIZES)))


def test_ghost_clipping_refuses_units(world):
    with pytest.raises(ConfigError, match="ghost.*hooks, functorch, vmap or bk"):
        DPAdapt(unit="user", grad_sample_mode="ghost")
    seqs = world["ctx"].encode(word_texts(N_RECORDS, 3), 64)
    with pytest.raises(ConfigError, match="ghost"):
        dp_train(tiny_model(world), seqs, pad_id=0, epsilon=8.0, delta=None, clip=0.1, epochs=1.0, lr=1e-3,
                 batch_size=4, seed=0, grad_sample_mode="ghost", units=_units(), unit="user")


# ------------------------------------------------------------------------------ the guarantee
def _adapt(world, data: AdaptationData, **params):
    d = DPAdapt(**{"method": "head", "epsilon": 3.0, "epochs": 1.0, "batch_size": 4, "chunk_length": 64, **params})
    ctx = world["ctx"]
    return d.adapt(tiny_model(world), data, TrainContext(ctx.tokenizer, ctx.device, 64, 0, False, False))


def test_user_level_guarantee_counts_users_not_records(world):
    texts = tuple(word_texts(N_RECORDS, 3))
    users = tuple(f"user{u}" for u in _units())
    out = _adapt(world, AdaptationData(texts, users=users), unit="user")
    g, led = out.guarantee, out.report["ledger"]
    n = len(SIZES)
    assert g["unit"] == led["unit"] == "user" and led["n_units"] == n and led["n_records"] == N_RECORDS
    assert g["delta"] == pytest.approx(1 / (2 * n))  # the default δ is over units
    assert g["sample_rate"] == pytest.approx(1 / math.ceil(n / 4)) and g["batch"] == pytest.approx(n / 3)
    assert 0 < g["value"] <= 3.0 * 1.0001
    # one user's 6 records are clipped as one: no k·ε; the group bound is that of a swap of two users
    assert g["unit_records_max"] == max(SIZES) and g["group_k"] == 2
    assert g["group_epsilon"] == pytest.approx(2 * g["value"])
    # the record-level run of the same data claims ε per record and k·ε for the largest user
    rec = _adapt(world, AdaptationData(texts, users=users)).guarantee
    assert rec["unit"] == "record" and rec["group_k"] == max(SIZES) and rec["group_by"] == "user"
    assert rec["group_epsilon"] == pytest.approx(max(SIZES) * rec["value"])
    assert rec["delta"] == pytest.approx(1 / (2 * N_RECORDS))


def test_auto_unit_takes_the_unit_the_data_names(world):
    texts = list(word_texts(N_RECORDS, 3))
    texts[5:8] = [texts[4]] * 3  # a text inserted 4 times
    g = _adapt(world, AdaptationData(tuple(texts)), unit="auto").guarantee
    assert g["unit"] == "text" and g["unit_records_max"] == 4 and g["n_units"] == N_RECORDS - 3
    secrets = tuple(("s1",) if i < 3 else ("s2",) if i < 5 else () for i in range(N_RECORDS))
    g = _adapt(world, AdaptationData(tuple(word_texts(N_RECORDS, 3)), secrets=secrets), unit="auto").guarantee
    assert g["unit"] == "secret" and g["unit_records_max"] == 3 and g["n_units"] == N_RECORDS - 3
    with pytest.raises(ConfigError, match="owner of each text"):
        _adapt(world, AdaptationData(tuple(word_texts(N_RECORDS, 3))), unit="user")
