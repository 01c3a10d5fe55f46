"""DP adaptation: the accounting ledger against published values and Opacus, and each DP method end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.accounting import (
    DPLedger, epsilon_for, epsilon_with, group_privacy, largest_group, noise_for_epsilon,
)
from bench.defense import TrainContext
from bench.errors import ConfigError
from bench.game import AdaptationData
from tiny_training import one_thread, tiny_model, tiny_trainable, tiny_world, word_texts
import defenses.dp as dp_module
from defenses.dp import DPAdapt, LORA_TARGETS, _Collate, _VmapDP, dp_train, record_losses, train_prefix

DELTA = 1e-5


_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


# ----------------------------------------------------------------------------------- accounting
# TensorFlow Privacy, tutorials/README.md (github.com/tensorflow/privacy, "Select Parameters" table and
# "Using Command-Line Interface for Privacy Budgeting"): MNIST, N = 60000, batch 256, delta = 1e-5,
#   noise 1.1, 60 epochs -> eps = 3.01;  noise 1.3, 15 epochs -> eps = 1.19;  noise 0.7, 45 epochs -> eps = 7.10
# computed by compute_dp_sgd_privacy.py: RDP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019),
# steps = ceil(epochs * N / batch), converted with the classic bound eps = min_a rdp(a) + log(1/delta) / (a - 1).
PUBLISHED = [(1.1, 60, 3.01), (1.3, 15, 1.19), (0.7, 45, 7.10)]


@pytest.mark.parametrize("sigma,epochs,published", PUBLISHED)
def test_rdp_reproduces_published_tf_privacy_values(sigma, epochs, published):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    q, steps = 256 / 60000, math.ceil(epochs * 60000 / 256)
    orders = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    rdp = np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders))
    classic = float(np.min(rdp + math.log(1 / DELTA) / (orders - 1)))
    assert classic == pytest.approx(published, abs=0.006)  # the published value, to its printed precision
    # the ledger uses Opacus' tighter RDP -> (eps, delta) conversion (Balle et al. 2020): never larger
    eps = epsilon_with("rdp", sigma, q, steps, DELTA)
    assert 0.75 * published <= eps <= published


def test_ledger_matches_opacus_accountants_and_rdp_prv_agree():
    from opacus.accountants import PRVAccountant, RDPAccountant

    sigma, q, steps = 1.0, 0.01, 1000
    got = epsilon_for(sigma, q, steps, DELTA)
    assert got["rdp_error"] is None and got["prv_error"] is None
    for name, cls in (("rdp", RDPAccountant), ("prv", PRVAccountant)):
        acc = cls()
        for _ in range(steps):  # Opacus' own per-step bookkeeping, as the PrivacyEngine does it
            acc.step(noise_multiplier=sigma, sample_rate=q)
        assert got[f"eps_{name}"] == pytest.approx(acc.get_epsilon(delta=DELTA), rel=1e-6)
    # canonical cross-check: PRV (numerically ~exact) <= RDP (an upper bound). Measured here: RDP 2.10,
    # PRV 1.84, i.e. RDP is 14 % above PRV at this point, so the two agree within 15 %, not within 10 %.
    assert got["eps_prv"] <= got["eps_rdp"] <= 1.15 * got["eps_prv"]


def test_epsilon_for_records_which_accountant_failed(monkeypatch):
    from opacus.accountants import PRVAccountant

    def boom(self, delta, **kw):
        raise RuntimeError("prv domain too large")

    monkeypatch.setattr(PRVAccountant, "get_epsilon", boom)
    got = epsilon_for(1.0, 0.01, 100, DELTA)
    assert got["eps_prv"] is None and "prv domain too large" in got["prv_error"]
    assert got["rdp_error"] is None and got["eps_rdp"] > 0
    led = DPLedger.build(sigma=1.0, sample_rate=0.01, steps=100, clip=0.1, delta=DELTA, n_records=100,
                         target_epsilon=None, accountant="given")
    assert led.epsilon == led.eps_rdp


@pytest.mark.parametrize("target", [0.1, 0.5, 1.0, 3.0, 8.0])
def test_noise_for_epsilon_round_trips(target):
    q, steps, delta = 1 / 32, 128, 1 / 500
    sigma = noise_for_epsilon(target, delta, q, steps)
    eps = epsilon_for(sigma, q, steps, delta)["eps_rdp"]
    assert 0.95 * target <= eps <= target


def test_noise_for_epsilon_prv_and_errors():
    q, steps, delta = 1 / 32, 128, 1 / 500
    sigma = noise_for_epsilon(3.0, delta, q, steps, accountant="prv")
    assert 0.95 * 3.0 <= epsilon_with("prv", sigma, q, steps, delta) <= 3.0 * 1.001
    assert sigma < noise_for_epsilon(3.0, delta, q, steps)  # PRV is tighter: less noise for the same eps
    with pytest.raises(ConfigError):
        noise_for_epsilon(math.inf, delta, q, steps)
    with pytest.raises(ConfigError):
        noise_for_epsilon(1.0, 1.5, q, steps)
    assert epsilon_with("rdp", 0.0, q, steps, delta) == math.inf


def test_group_privacy_matches_hand_computation():
    # k = 3, eps = 0.5, delta = 1e-5: eps_3 = 3 * 0.5 = 1.5; delta_3 = 3 * e^(2 * 0.5) * 1e-5 = 3 * 2.718281828 * 1e-5
    eps3, delta3 = group_privacy(0.5, 1e-5, 3)
    assert eps3 == pytest.approx(1.5) and delta3 == pytest.approx(8.154845e-5, rel=1e-6)
    # a valid bound: never below the chained sum delta * (1 + e^eps + e^2eps) it relaxes
    chained = 1e-5 * (1 + math.exp(0.5) + math.exp(1.0))
    assert chained < delta3
    assert group_privacy(2.0, 1e-6, 1) == (2.0, 1e-6)  # a group of one record is the record-level guarantee
    e_big, d_big = group_privacy(8.0, 1e-5, 200)  # e^(199 * 8) overflows a float: reported as inf, not an error
    assert e_big == pytest.approx(1600.0) and d_big == math.inf
    assert group_privacy(0.0, 1e-5, 4) == (0.0, pytest.approx(4e-5))
    # a negative eps from the accountant (huge noise) counts as 0: the closed form needs eps >= 0
    assert group_privacy(-0.01, 1e-2, 3) == (0.0, pytest.approx(3e-2))
    for bad in ((1.0, 1e-5, 0), (1.0, 1e-5, 2.5), (1.0, 1.0, 2), (float("nan"), 1e-5, 2)):
        with pytest.raises(ConfigError):
            group_privacy(*bad)


def test_largest_group_counts_users_secrets_and_repeats():
    texts = ["a", "b", "c", "a", "d", "a"]
    assert largest_group(texts) == (3, "identical text")  # "a" three times: a canary inserted 3 times
    assert largest_group(["a", "b"]) == (1, "identical text")
    users = ["u1", "u2", "u2", "u1", "u2", "u2"]
    assert largest_group(texts, users=users) == (4, "user")
    secrets = [("s1",), ("s1", "s2"), (), ("s2", "s2"), ("s2",), ()]  # a secret named twice in one record counts once
    assert largest_group(texts, secrets=secrets) == (3, "secret")
    assert largest_group(texts, secrets=[()] * 6) == (3, "identical text")  # no record carries a secret
    with pytest.raises(ConfigError):
        largest_group(texts, users=users[:-1])
    with pytest.raises(ConfigError):
        largest_group([])


# ----------------------------------------------------------------------------------- training
_texts = word_texts
_model = tiny_model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return {**tiny_world(tmp_path_factory.mktemp("bpe")), "data": AdaptationData(tuple(word_texts(48, 1)))}


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed(before: dict, after: dict) -> set[str]:
    assert set(before) == set(after)
    return {k for k in before if not torch.equal(before[k], after[k])}


def _adapt(world, seed: int = 0, **params):
    d = DPAdapt(**{"epochs": 1.0, "batch_size": 8, "chunk_length": 64, **params})
    model = _model(world)
    before = _state(model)
    ctx = world["ctx"]
    ctx = TrainContext(ctx.tokenizer, ctx.device, ctx.max_length, seed, False, False)
    d.last = d.adapt(model, world["data"], ctx)   # the Adapted result: model, report, guarantee
    return d, before, d.last.model


def _check_release(world, out, tmp_path):
    from transformers import AutoModelForCausalLM, GPTNeoXForCausalLM

    ref = _model(world)
    assert type(out) is GPTNeoXForCausalLM
    assert out.config.to_dict() == ref.config.to_dict()  # same architecture, nothing added (no peft/Opacus keys)
    assert {k: v.shape for k, v in out.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    for p in out.parameters():  # no Opacus leftovers on the released weights
        assert not hasattr(p, "grad_sample") and not hasattr(p, "_forward_counter")
    out.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert type(back) is GPTNeoXForCausalLM
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        assert torch.allclose(back(input_ids=ids).logits, out.eval()(input_ids=ids).logits, atol=1e-5)


def _check_guarantee(d, target):
    g = d.last.guarantee
    assert g["name"] == "epsilon" and math.isfinite(g["value"]) and 0 < g["value"] <= target * 1.0001
    assert g["value"] == pytest.approx(g["eps_rdp"]) and g["eps_prv"] is not None and g["eps_prv"] <= g["eps_rdp"]
    rep = d.last.report
    n = rep["train"]["n_records"]
    assert g["delta"] == pytest.approx(1 / (2 * n)) and g["clip"] == 0.1 and g["poisson"] is True
    assert g["unit"] == "record"
    # the world's 48 sentences are distinct, no users or secrets: the largest group is one record, the bound is eps
    assert (g["group_k"], g["group_by"]) == (1, "identical text")
    assert g["group_epsilon"] == g["value"] and g["group_delta"] == g["delta"]
    assert g["sigma"] > 0 and g["steps"] == rep["train"]["steps"] == round(1.0 / g["sample_rate"])
    assert g["sample_rate"] == pytest.approx(1 / 6) and g["batch"] == pytest.approx(8)  # 48 records, batch 8
    assert rep["ledger"]["eps_rdp"] == g["eps_rdp"] and rep["train"]["step_seconds_mean"] > 0


def test_full_dp_changes_every_weight_and_releases_plain_neox(world, tmp_path):
    d, before, out = _adapt(world, method="full", epsilon=8.0)
    changed = _changed(before, _state(out))
    params = {k for k, _ in out.named_parameters()}
    assert params <= changed  # noise reaches every trainable weight
    _check_release(world, out, tmp_path)
    _check_guarantee(d, 8.0)


def test_head_dp_changes_only_the_output_embedding(world, tmp_path):
    d, before, out = _adapt(world, method="head", epsilon=3.0)
    head = [k for k, v in out.state_dict().items() if v.data_ptr() == out.get_output_embeddings().weight.data_ptr()]
    assert _changed(before, _state(out)) == set(head) and head
    assert d.last.report["trainable_params"] == out.get_output_embeddings().weight.numel()
    assert all(p.requires_grad for p in out.parameters())
    _check_release(world, out, tmp_path)
    _check_guarantee(d, 3.0)


@pytest.mark.parametrize("mode", ["hooks", "vmap"])
def test_lora_dp_merges_into_targeted_modules_only(world, tmp_path, mode):
    d, before, out = _adapt(world, method="lora", epsilon=1.0, lr=1e-2, grad_sample_mode=mode)
    changed = _changed(before, _state(out))
    assert changed, "merged LoRA must change the targeted weights"
    for k in changed:
        module = k.rsplit(".", 1)[0].rsplit(".", 1)[-1]
        assert module in LORA_TARGETS and k.endswith(".weight"), k
    assert not any(k.endswith("bias") or "layernorm" in k or "embed" in k for k in changed)
    assert d.last.report["trainable_params"] < 0.2 * d.last.report["total_params"]
    _check_release(world, out, tmp_path)
    _check_guarantee(d, 1.0)


def test_epsilon_inf_is_the_non_private_run(world, tmp_path):
    d, before, out = _adapt(world, method="head", epsilon="inf")
    g = d.last.guarantee
    assert g["value"] == math.inf and g["name"] == "epsilon" and d.last.report["ledger"] is None
    assert _changed(before, _state(out))
    _check_release(world, out, tmp_path)
    assert DPAdapt(epsilon=".inf").epsilon == math.inf and DPAdapt().guarantee() is None  # nothing adapted: no guarantee
    assert g["unit"] == "record" and not any(k.startswith("group_") for k in g)  # no DP, so no group bound


def _adapt_on(world, data: AdaptationData, **params):
    d = DPAdapt(**{"method": "head", "epsilon": 3.0, "epochs": 1.0, "batch_size": 8, "chunk_length": 64, **params})
    return d.adapt(_model(world), data, world["ctx"]).guarantee


@pytest.mark.parametrize("kind", ["user", "secret", "identical text"])
def test_guarantee_reports_group_privacy_of_the_largest_group(world, kind):
    texts = list(world["data"].texts)
    assert len(set(texts)) == len(texts)  # distinct: the groups below are the only ones
    users = secrets = None
    if kind == "user":  # user u0 owns 6 records (every 9th), everyone else one
        users = tuple("u0" if i % 9 == 0 else f"u{i}" for i in range(len(texts)))
        k = 6
    elif kind == "secret":  # secret s owned by 4 records, t by 2
        secrets = tuple(("s",) if i < 4 else ("t",) if i < 6 else () for i in range(len(texts)))
        k = 4
    else:  # a canary inserted 7 times
        texts = texts[:-6] + [texts[0]] * 6
        k = 7
    g = _adapt_on(world, AdaptationData(tuple(texts), users=users, secrets=secrets))
    eps, delta = g["value"], g["delta"]
    assert g["unit"] == "record" and g["group_by"] == kind and g["group_k"] == k
    assert delta == pytest.approx(1 / (2 * len(texts)))
    assert g["group_epsilon"] == pytest.approx(k * eps) and g["group_epsilon"] > eps
    assert g["group_delta"] == pytest.approx(k * math.exp((k - 1) * eps) * delta) and g["group_delta"] > delta


def _recorded_batches(monkeypatch, world, **kw) -> tuple[list[list[int]], dict]:
    """Record indices the training loop fetches, batch by batch, for one dp_train run on the head."""
    log: list[list[int]] = []

    class Recorded(dp_module._Records):
        def __getitems__(self, idx):  # DataLoader fetches a whole (possibly empty) batch through this
            log.append(list(idx))
            return [self.seqs[i] for i in idx]

    monkeypatch.setattr(dp_module, "_Records", Recorded)
    model = _model(world)
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(True)
    seqs = world["ctx"].encode(world["data"].texts, 64)
    rep = dp_train(model, seqs, pad_id=world["ctx"].pad_id, delta=None, clip=0.1, epochs=1.5, lr=1e-3,
                   batch_size=8, **kw)
    assert len(log) >= rep["steps"]  # the loop may fetch one batch past the last step
    return log[: rep["steps"]], rep


def test_private_and_non_private_paths_train_on_the_same_poisson_batches(monkeypatch, world):
    """Opacus' make_private rebuilds the loader (hooks path); epsilon = inf and vmap build theirs directly.
    All must draw the same Poisson batches from the run's seed, so epsilon = inf differs from DP only by
    clipping and noise."""
    hooks, rep = _recorded_batches(monkeypatch, world, seed=3, epsilon=8.0, grad_sample_mode="hooks")
    vmap, _ = _recorded_batches(monkeypatch, world, seed=3, epsilon=8.0, grad_sample_mode="vmap")
    inf, rep_inf = _recorded_batches(monkeypatch, world, seed=3, epsilon=math.inf)
    assert rep["private"] and not rep_inf["private"] and rep["steps"] == rep_inf["steps"] == 9
    assert hooks == vmap == inf
    sizes = [len(b) for b in hooks]
    assert len(set(sizes)) > 1 and all(len(set(b)) == len(b) for b in hooks)  # Poisson: sizes vary, no repeats
    other, _ = _recorded_batches(monkeypatch, world, seed=4, epsilon=math.inf)
    assert other != inf  # the batches follow the seed (the recording is not vacuous)


def _delta(world, seed=0, **params) -> torch.Tensor:
    d, before, out = _adapt(world, seed=seed, method="head", **params)
    w = out.get_output_embeddings().weight.detach()
    key = next(k for k, v in out.state_dict().items() if v.data_ptr() == w.data_ptr())
    return (w - before[key]).flatten(), d


def test_dp_clips_per_record_gradients(world):
    # AdamW divides by sqrt(v) + 1e-8, so it undoes any uniform scaling of the gradient: clipping only
    # shows once the clipped gradient is far below Adam's eps (a clip of 1e-6 would still move weights by ~lr
    # per step). clip 1e-14 -> |update| <= lr * 1e-14 / 1e-8 per step.
    tiny, _ = _delta(world, clip=1e-14, noise_multiplier=0.0)
    free, d = _delta(world, clip=1.0, noise_multiplier=0.0)
    assert tiny.abs().max() < 1e-6 < 1e-4 < free.abs().max()
    assert d.last.guarantee["value"] == math.inf  # sigma 0: no guarantee, and the ledger says so


def test_dp_adds_noise(world):
    clean, _ = _delta(world, clip=0.1, noise_multiplier=0.0)
    noisy, d = _delta(world, clip=0.1, noise_multiplier=1e4)
    noisy2, _ = _delta(world, seed=1, clip=0.1, noise_multiplier=1e4)
    corr = lambda a, b: float(torch.corrcoef(torch.stack([a, b]))[0, 1])  # noqa: E731
    assert abs(corr(noisy, clean)) < 0.05 and abs(corr(noisy, noisy2)) < 0.05  # the signal is drowned
    assert 0.45 < float((noisy > 0).float().mean()) < 0.55  # symmetric, random directions
    assert d.last.guarantee["value"] < 1e-2 and d.last.guarantee["accountant"] == "given"


def test_poisson_sampling_and_opacus_account(world):
    seqs = world["ctx"].encode(world["data"].texts, 64)
    model = _model(world)
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(True)
    rep = dp_train(model, seqs, pad_id=world["ctx"].pad_id, epsilon=8.0, delta=None, clip=0.1, epochs=2.0, lr=1e-3,
                   batch_size=8, seed=3)
    led = rep["ledger"]
    assert led["steps"] == 12 and led["sample_rate"] == pytest.approx(1 / 6) and led["delta"] == pytest.approx(1 / 96)
    assert led["eps_rdp"] <= 8.0 and led["target_epsilon"] == 8.0 and led["accountant"] == "rdp"
    # Poisson batches vary in size: over 12 steps the token count is not 12 fixed batches' worth
    assert rep["tokens"] > 0


def test_prefix_trains_under_dp(world):
    """Release of prefix-tuned models is tested in tests/test_prefix.py."""
    model = _model(world)
    base = _state(model)
    seqs = world["ctx"].encode(world["data"].texts, 56)
    peft_model, rep = train_prefix(model, seqs, prefix_length=4, pad_id=world["ctx"].pad_id, epsilon=8.0,
                                   delta=None, clip=0.1, epochs=1.0, lr=1e-2, batch_size=8, seed=0)
    trained = {k for k, p in peft_model.named_parameters() if p.requires_grad}
    assert trained and all("prompt_encoder" in k for k in trained)
    assert not _changed(base, _state(model))  # the base weights are untouched: only the prefix learned
    assert rep["ledger"]["eps_rdp"] <= 8.0


@pytest.mark.parametrize("fast,method", [("vmap", "full"), ("vmap", "lora"), ("bk", "full"), ("bk", "head"),
                                         ("bk", "lora")])
def test_vmap_dp_step_equals_opacus(world, fast, method):
    """The fast paths (_VmapDP: one vmap over the model, sparse input-embedding gradients, own clip + noise;
    BookKeepingDP: norms and clipped sums from activations and output gradients) give the same noise-free
    clipped update as Opacus' hooks + DPOptimizer."""
    from opacus import PrivacyEngine

    from defenses.dp_bookkeeping import BookKeepingDP

    seqs = world["ctx"].encode(world["data"].texts[:6], 64)
    ids, mask = _Collate(world["ctx"].pad_id)(seqs)  # right-padded, lengths differ
    assert (mask == 0).any()

    def build():
        return tiny_trainable(world, method).train()

    clip = 0.05
    model = build()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    loader = torch.utils.data.DataLoader(seqs, batch_size=6, collate_fn=_Collate(0))
    hooks, opt, _ = PrivacyEngine().make_private(module=model, optimizer=opt, data_loader=loader,
                                                 noise_multiplier=0.0, max_grad_norm=clip, wrap_model=False)
    record_losses(model(input_ids=ids, attention_mask=mask).logits, ids, mask).mean().backward()
    opt.expected_batch_size = 6
    opt.step()
    ref = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    hooks.cleanup()

    model = build()
    step = (_VmapDP if fast == "vmap" else BookKeepingDP)(
        model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0), noise_multiplier=0.0,
        max_grad_norm=clip, expected_batch_size=6, generator=None,
        **({"loss_fn": record_losses} if fast == "bk" else {}))
    assert (step.emb is not None) == (method == "full")
    step.backward(ids, mask)
    step.step()
    got = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert got.keys() == ref.keys()
    scale = max(float(v.abs().max()) for v in ref.values())
    for n in ref:
        assert torch.allclose(got[n], ref[n], atol=1e-4 * scale, rtol=1e-3), n
    # clipping was active: the clipped update is smaller than the raw mean gradient would be
    total = math.sqrt(sum(float(v.pow(2).sum()) for v in ref.values()))
    assert total <= clip + 1e-6


@pytest.mark.parametrize("mode,method", [("ghost", "full"), ("ghost", "head"), ("ghost", "lora"), ("ghost", "prefix"),
                                         ("bk", "full"), ("bk", "head"), ("bk", "lora")])
def test_fast_clipping_step_equals_hooks_with_noise(world, mode, method, monkeypatch):
    """Opacus' ghost clipping (norms without per-record gradients; mixed for LayerNorm) and book-keeping (one
    backward without weight gradients; defenses/dp_bookkeeping.py) take the same clipped-and-noised step as the
    hooks mode: same seed, same Poisson batch, same noise generator, and the same privacy ledger. The noisy
    gradients AdamW receives are compared, not only the weights (Adam's first step is about lr·sign(g), which
    would hide a wrong clipping scale)."""
    from defenses.dp import ghost_coverage

    seqs = world["ctx"].encode(world["data"].texts, 64)
    grads: list[torch.Tensor] = []

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):
            grads.extend(p.grad.detach().clone() for g in self.param_groups for p in g["params"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)

    def run(mode):
        grads.clear()
        kw = dict(pad_id=world["ctx"].pad_id, epsilon=8.0, delta=None, clip=0.05, epochs=1 / 6, lr=1e-3,
                  batch_size=8, seed=7, grad_sample_mode=mode)
        if method == "prefix":
            model, rep = train_prefix(_model(world), seqs, prefix_length=4, **kw)
        else:
            model = tiny_trainable(world, method)
            before = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
            rep = dp_train(model, seqs, **kw)
        if method == "prefix":
            before = None
        after = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
        for p in model.parameters():  # nothing of Opacus is left on the model
            assert not hasattr(p, "_norm_sample") and not hasattr(p, "grad_sample")
        return model, before, after, rep, list(grads)

    _, before, ref, rep_h, g_h = run("hooks")
    model, _, got, rep_g, g_g = run(mode)
    assert len(g_h) == len(g_g) == len(ref) > 0
    scale = max(float(g.abs().max()) for g in g_h)
    for a, b in zip(g_h, g_g):
        assert torch.allclose(a, b, atol=1e-5 * scale, rtol=1e-4)
    assert rep_h["steps"] == rep_g["steps"] == 1 and rep_g["tokens"] == rep_h["tokens"] > 0
    assert got.keys() == ref.keys() and got
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=1e-5), k
    if before is not None:  # the step moved the weights (so the comparison is not of two untouched models)
        assert any(not torch.equal(before[k], got[k]) for k in got)
    led_h = {k: v for k, v in rep_h["ledger"].items() if k != "grad_sample_mode"}
    led_g = {k: v for k, v in rep_g["ledger"].items() if k != "grad_sample_mode"}
    assert led_h == led_g and rep_g["ledger"]["grad_sample_mode"] == mode
    if mode != "ghost":
        return
    cover = ghost_coverage(model)
    assert "Linear" in cover["ghost"] or "Embedding" in cover["ghost"]
    if method == "full":
        assert "LayerNorm" in cover["per_record"] and "Embedding" in cover["ghost"]


def test_measure_step_cost_reports_every_mode_and_the_device():
    from defenses.dp import measure_step_cost, step_cost_table

    r = measure_step_cost("nano", method="prefix", batch=2, length=16, steps=3, vocab=512, device="cpu")
    assert r["device"] == "cpu" and r["method"] == "prefix" and r["nonprivate_cpu_s"] > 0
    for mode in ("hooks", "functorch", "ghost"):
        assert r[f"{mode}_ratio_cpu"] > 0, mode
    assert "vmap" in r["vmap_error"] and "vmap_cpu_s" not in r  # vmap cannot train a prefix: said, not hidden
    assert "bk" in r["bk_error"] and "bk_cpu_s" not in r
    table = step_cost_table([r])
    assert "ghost" in table and table.splitlines()[-1].split()[0] == "prefix" and "n/a" in table
    with pytest.raises(ConfigError, match="unknown method"):
        measure_step_cost("nano", method="everything")


def test_measure_step_cost_times_unit_level_steps():
    from defenses.dp import main, measure_step_cost, step_cost_table

    r = measure_step_cost("nano", method="full", batch=3, length=16, steps=3, vocab=512, device="cpu",
                          unit_sizes=[2, 1])
    assert r["units"] == 2
    for mode in ("hooks", "functorch", "vmap", "bk"):
        assert r[f"{mode}_ratio_cpu"] > 0, (mode, r.get(f"{mode}_error"))
    assert "units" in r["ghost_error"] and "ghost_cpu_s" not in r  # ghost cannot clip a unit: said, not hidden
    assert "in 2 units" in step_cost_table([r])
    for bad in ([2, 2], [3, 0], []):
        with pytest.raises(ConfigError, match="summing to batch"):
            measure_step_cost("nano", batch=3, unit_sizes=bad)
    assert main(["nano", "full", "--batch", "3", "--units", "2,x"]) == 2


def test_bookkeeping_refuses_what_it_cannot_clip_exactly():
    """Book-keeping tracks Linear, LayerNorm and the input Embedding; a tied embedding (one parameter, two
    layers) or another trainable layer type must be refused with the modes that handle it, not mis-clipped."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    from defenses.dp_bookkeeping import BookKeepingDP

    def make(model):
        return BookKeepingDP(model, torch.optim.SGD(model.parameters(), lr=0.0), noise_multiplier=1.0,
                             max_grad_norm=1.0, expected_batch_size=4, generator=None, loss_fn=record_losses)

    tied = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=32, tie_word_embeddings=True))
    with pytest.raises(ConfigError, match="tied embeddings.*hooks"):
        make(tied)
    rms = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=2, intermediate_size=32, tie_word_embeddings=False))
    with pytest.raises(ConfigError, match="LlamaRMSNorm.*hooks or vmap"):
        make(rms)
    with pytest.raises(ConfigError, match="prefix with grad_sample_mode bk"):
        train_prefix(tied, [[1, 2, 3]], prefix_length=2, grad_sample_mode="bk")


def test_bookkeeping_step_assembles_gradients_in_multi_tensor_kernels():
    """A small model's DP step on a GPU is bound by kernel launches (docs/benchmarks.md, "DP-SGD step cost on
    CUDA"), so book-keeping adds noise and divides by the expected batch size in two multi-tensor (foreach)
    operations, not two per parameter, makes no zero gradient it does not use and no no-op dtype casts. Counted
    as the top-level operations one step dispatches, which grow with the parameters only in the noise draws
    (one per parameter, the generator's stream as Opacus draws it)."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from defenses.dp_bookkeeping import BookKeepingDP

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                             intermediate_size=32, tie_word_embeddings=False)).train()
    params = [p for p in model.parameters() if p.requires_grad]
    dp = BookKeepingDP(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                       expected_batch_size=4, generator=torch.Generator().manual_seed(0), loss_fn=record_losses)
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    dp.backward(ids, torch.ones_like(ids))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dp.step()
    top = Counter(e.name for e in prof.events()
                  if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    assert top["aten::normal"] == len(params) > 20  # one draw per parameter
    assert top["aten::_foreach_add_"] == 1 and top["aten::_foreach_div_"] == 1
    assert top["aten::div"] == 0
    assert top["aten::to"] == 1  # the input embedding's token-equality mask, bool to float; no no-op casts
    assert top["aten::zeros_like"] == 1  # the input embedding's gradient, filled by index_add_
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)


def _bk_step_ops(layers: int, group: bool, length: int) -> tuple[int, int]:
    """(top-level operations of one book-keeping step, trainable parameters) of a GPT-NeoX of ``layers`` blocks."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from defenses.dp_bookkeeping import BookKeepingDP

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=16, num_hidden_layers=layers,
                                             num_attention_heads=2, intermediate_size=32,
                                             tie_word_embeddings=False)).train()
    params = [p for p in model.parameters() if p.requires_grad]
    dp = BookKeepingDP(model, torch.optim.SGD(params, lr=0.1, foreach=True), noise_multiplier=1.0, max_grad_norm=1.0,
                       expected_batch_size=4, generator=torch.Generator().manual_seed(0), loss_fn=record_losses,
                       group_layers=group)
    ids = torch.randint(0, 64, (4, length), generator=torch.Generator().manual_seed(1))
    dp.backward(ids, torch.ones_like(ids))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dp.step()
    top = Counter(e.name for e in prof.events()
                  if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    assert all(torch.isfinite(p.grad).all() for p in params)
    return sum(top.values()), len(params)


@pytest.mark.parametrize("length", [4, 12])  # 4 tokens: ghost norms for every Linear; 12: formed gradients
def test_bookkeeping_grouped_step_grows_with_depth_only_by_the_noise_draws(length):
    """On a GPU a small model's DP step is bound by kernel launches, so book-keeping there stacks the layers of
    one shape and runs each norm and clipped-sum operation once per group: two more blocks add only their
    parameters' noise draws (Opacus' generator stream, one per parameter) to the step, where the per-layer step
    adds several operations per parameter."""
    (shallow, p_shallow), (deep, p_deep) = _bk_step_ops(2, True, length), _bk_step_ops(4, True, length)
    assert deep - shallow == p_deep - p_shallow > 0
    (shallow, _), (deep, _) = _bk_step_ops(2, False, length), _bk_step_ops(4, False, length)
    assert deep - shallow > 5 * (p_deep - p_shallow)


@pytest.mark.parametrize("method", ["full", "lora", "head"])
@pytest.mark.parametrize("units", [None, [1, 3, 2, 1, 1]])
@pytest.mark.parametrize("length", [8, 48])  # hidden size 64: ghost norms at 8 tokens, formed gradients at 48
def test_bookkeeping_grouped_step_equals_the_per_layer_step(method, units, length):
    """Grouping layers changes only the order of the sums: from the same model, batches and noise generator the
    grouped and per-layer steps give the same noisy gradients and weights over three steps (float32 rounding),
    at record and unit level, on the ghost-norm and the formed-gradient paths; with the groups taken apart
    (``group_layers`` False, the CPU default) the step is the one the stored runs were trained with."""
    from transformers import GPTNeoXConfig

    from defenses.dp import step_cost_model
    from defenses.dp_bookkeeping import BookKeepingDP

    cfg = GPTNeoXConfig(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=64, rotary_pct=0.25,
                        use_parallel_residual=True, tie_word_embeddings=False)
    row_unit = None if units is None else torch.tensor([u for u, k in enumerate(units) for _ in range(k)])

    def train(group: bool):
        model = step_cost_model(cfg, method)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        dp = BookKeepingDP(model, opt, noise_multiplier=0.7, max_grad_norm=0.5, expected_batch_size=8,
                           generator=torch.Generator().manual_seed(3), loss_fn=record_losses, group_layers=group)
        assert dp.group_layers is group
        data, grads = torch.Generator().manual_seed(1), []
        for _ in range(3):
            ids = torch.randint(0, 512, (8, length), generator=data)
            mask = torch.ones_like(ids)
            mask[0, length // 2:] = 0
            dp.backward(ids, mask) if row_unit is None else dp.backward(ids, mask, row_unit)
            dp.step()
            grads.append([p.grad.clone() for p in dp.params])
            dp.zero_grad()
        return grads, [p.detach().clone() for p in model.parameters()]

    (g_each, w_each), (g_grouped, w_grouped) = train(False), train(True)
    for step_each, step_grouped in zip(g_each, g_grouped):
        for a, b in zip(step_each, step_grouped):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(a.abs().max())), (method, units, length)
    for a, b in zip(w_each, w_grouped):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    if method == "full":  # the full model's blocks are grouped: the two orders of summation really differ
        assert any(not torch.equal(a, b) for s_a, s_b in zip(g_each, g_grouped) for a, b in zip(s_a, s_b))


def test_bookkeeping_under_bf16_autocast_clips_within_bf16_rounding_and_is_timed_beside_a_bf16_step():
    """`python -m defenses.dp --bf16` times book-keeping with its forward pass under bf16 autocast against a
    non-private step under the same autocast (how the anchors train): the step really runs in bf16 (its clipped
    update moves, within bf16 rounding), Opacus' modes are refused, and the table says so."""
    from transformers import GPTNeoXConfig

    from defenses.dp import measure_step_cost, step_cost_model, step_cost_table
    from defenses.dp_bookkeeping import BookKeepingDP

    cfg = GPTNeoXConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=64, rotary_pct=0.25,
                        use_parallel_residual=True, tie_word_embeddings=False)
    ids = torch.randint(0, 512, (6, 24), generator=torch.Generator().manual_seed(1))

    def update(bf16: bool) -> torch.Tensor:
        model = step_cost_model(cfg, "full")
        dp = BookKeepingDP(model, torch.optim.SGD([p for p in model.parameters()], lr=0.0), noise_multiplier=0.0,
                           max_grad_norm=0.05, expected_batch_size=6, generator=None, loss_fn=record_losses,
                           autocast_bf16=bf16)
        dp.backward(ids, torch.ones_like(ids))
        dp.step()
        return torch.cat([p.grad.reshape(-1) for p in dp.params])

    fp32, bf16 = update(False), update(True)
    assert 0 < float((fp32 - bf16).norm() / fp32.norm()) < 0.1
    r = measure_step_cost("nano", method="full", batch=2, length=16, steps=3, vocab=512, device="cpu",
                          modes=("hooks", "bk"), autocast_bf16=True)
    assert r["autocast_bf16"] is True and r["bk_ratio_cpu"] > 0 and "bf16" in r["hooks_error"]
    assert "bf16 autocast" in step_cost_table([r]).splitlines()[0]


def test_bookkeeping_groups_layers_on_cuda_only_by_default():
    """The per-layer step is the CPU default: its rounding is the one the stored CPU runs hold."""
    from defenses.dp_bookkeeping import BookKeepingDP

    lin = torch.nn.Linear(4, 4)
    dp = BookKeepingDP(lin, torch.optim.SGD(lin.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                       expected_batch_size=2, generator=None, loss_fn=record_losses)
    assert dp.group_layers is False


def test_step_cost_command_takes_batch_length_and_steps_and_refuses_bad_values(capsys):
    """`python -m defenses.dp` measures at the batch the user names (on a GPU, small batches are launch-bound), and
    a bad value stops with an error naming it, before any model is built."""
    from defenses.dp import main

    assert main(["nano", "prefix", "--batch", "2", "--length", "16", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "batch 2 x 16 tokens" in out and out.splitlines()[1].split()[0] == "method"
    for argv, word in ((["nano", "head", "--batch", "0"], "batch"), (["nano", "head", "--length", "1"], "length"),
                       (["nano", "head", "--steps", "2"], "warm-up"), (["nano", "everything"], "unknown method"),
                       (["gpt-17"], "unknown spec")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and word in err, (argv, err)


def test_expected_batch_is_the_exact_floor_of_n_times_q():
    """The divisor of the noisy sum is ⌊n·q⌋ with q = 1/batches (Opacus' expected batch size), exact: the float
    product n · (1/batches) falls below an integer for 184 of these (n, batch_size) pairs, e.g. 49 · (1/49)."""
    from fractions import Fraction
    float_off = 0
    for n in range(1, 1200):
        for batch_size in range(1, min(n, 64) + 1):
            batches = math.ceil(n / batch_size)
            exact = math.floor(Fraction(n, batches))
            assert dp_module.expected_batch(n, batches) == exact >= 1
            float_off += int(n * (1.0 / batches)) != exact
    assert float_off == 184  # the float product does go wrong in this range (the check is not vacuous)


@pytest.mark.parametrize("mode", ["hooks", "vmap", "bk"])
def test_a_batch_of_one_record_per_step_trains_finite_weights(world, mode):
    """49 records, one per step: Opacus' float expected batch size is int(49 · (1/49)) = 0, which divided the noisy
    sum by zero; the step now divides by 1 and every weight stays finite."""
    model = _model(world)
    for p in model.parameters():
        p.requires_grad_(False)
    head = model.get_output_embeddings().weight
    head.requires_grad_(True)
    before = head.detach().clone()
    seqs = (world["ctx"].encode(world["data"].texts, 64) * 2)[:49]
    rep = dp_train(model, seqs, pad_id=world["ctx"].pad_id, epsilon=8.0, delta=None, clip=0.1, epochs=0.1, lr=1e-3,
                   batch_size=1, seed=0, grad_sample_mode=mode)
    assert rep["private"] and rep["steps"] == 5
    assert torch.isfinite(head).all() and not torch.equal(head.detach(), before)
