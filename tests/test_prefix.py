"""Prefix tuning (Marek et al. 2026): trained with and without DP, released as base + peft adapter, reloaded as a
PeftModel whose scores equal the in-memory model's; and a runner-level world with ``dp_adapt`` method prefix."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from bench.errors import ConfigError
from bench.game import AdaptationData
from bench.lm import HFLanguageModel
from bench.release import is_release, load_release, save_release
from tiny_training import one_thread, tiny_model, tiny_world, word_texts
from defenses.dp import DPAdapt, PrefixRelease

_texts = word_texts
_model = tiny_model
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return {**tiny_world(tmp_path_factory.mktemp("bpe")), "data": AdaptationData(tuple(word_texts(48, 1)))}


def _make_lm(model, tok, suffix: str = ""):
    return HFLanguageModel(model, tok, fingerprint="loaded" + suffix, max_length=64, batch_size=5)


def test_released_prefix_model_scores_like_the_in_memory_one(world, tmp_path):
    model = _model(world)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    d = DPAdapt(method="prefix", epsilon=float("inf"), prefix_length=4, epochs=2.0, batch_size=8)
    result = d.adapt(model, world["data"], world["ctx"])
    rel = result.model
    assert isinstance(rel, PrefixRelease)
    trained = {k for k, p in rel.peft_model.named_parameters() if p.requires_grad}
    assert trained and all("prompt_encoder" in k for k in trained)
    assert all(torch.equal(base_state[k], v) for k, v in rel.peft_model.get_base_model().state_dict().items())
    assert result.guarantee["value"] == float("inf")  # non-private run: no guarantee

    save_release(rel, tmp_path)
    assert is_release(tmp_path)
    loaded = load_release(tmp_path, device=torch.device("cpu"), fingerprint="k", make_lm=_make_lm)
    mem = HFLanguageModel(rel.peft_model, world["tok"], fingerprint="mem", max_length=64, batch_size=5)
    plain = HFLanguageModel(_model(world), world["tok"], fingerprint="base", max_length=64, batch_size=5)
    texts = _texts(12, 7)
    got, want, base = (m.token_signals(texts) for m in (loaded, mem, plain))
    for g, w, b in zip(got, want, base):
        np.testing.assert_array_equal(g.token_ids, w.token_ids)
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
        np.testing.assert_allclose(g.mu, w.mu, atol=1e-5)
    # the prefix changes the model: the released handle is not the base model
    assert max(float(np.abs(g.logprobs - b.logprobs).max()) for g, b in zip(got, base)) > 1e-2
    # conditional signals, next-token distributions (left-padded batch == one at a time) and generation
    cond_l, cond_m = loaded.token_signals(texts[:3], prefix="alpha beta"), mem.token_signals(texts[:3], "alpha beta")
    for g, w in zip(cond_l, cond_m):
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    prompts = ["alpha", "river stone cloud market", "seven eleven blue"]
    batch = loaded.next_token_logprobs(prompts)
    single = np.concatenate([loaded.next_token_logprobs([p]) for p in prompts])
    np.testing.assert_allclose(batch, single, atol=1e-4)
    # the last position of a text's own signals is the next-token distribution after its head
    ids = loaded.encode(texts[0])
    head = world["tok"].decode(ids[1:5])
    assert loaded.next_token_logprobs([head])[0, ids[5]] == pytest.approx(float(got[0].logprobs[4]), abs=1e-4)
    assert loaded.generate(prompts, 6) == [_greedy_by_forward(rel.peft_model, world["tok"], loaded.encode(p), 6)
                                           for p in prompts]


def _greedy_by_forward(model, tok, ids: list[int], n: int) -> str:
    """Greedy continuation of one unpadded prompt, a full forward pass per token, positions as in scoring."""
    cur = torch.tensor([ids])
    for _ in range(n):
        with torch.no_grad():
            nxt = model(input_ids=cur, attention_mask=torch.ones_like(cur)).logits[:, -1].argmax(-1)
        cur = torch.cat([cur, nxt[:, None]], 1)
        if int(nxt) == tok.eos_token_id:
            break
    return tok.decode(cur[0, len(ids):].tolist(), skip_special_tokens=True)


def test_released_prefix_model_generates_with_its_prefix(world, tmp_path):
    """peft's own generate drops the prefix under transformers 5 (the continuation is the base model's); the
    release generates through its forward pass instead: every continuation of a left-padded batch is the prompt's
    greedy continuation under the prefix, and the prefix changes what is generated."""
    from peft import PrefixTuningConfig, get_peft_model
    torch.manual_seed(0)
    peft_model = get_peft_model(_model(world), PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.normal_(0.0, 1.0)  # a prefix that steers
    peft_model.eval()
    save_release(PrefixRelease(peft_model, world["tok"]), tmp_path)
    loaded = load_release(tmp_path, device=torch.device("cpu"), fingerprint="k", make_lm=_make_lm)
    plain = HFLanguageModel(_model(world), world["tok"], fingerprint="base", max_length=64, batch_size=5)
    prompts = ["alpha", "river stone cloud market", "seven eleven blue", "gamma delta", "blue"]
    want = [_greedy_by_forward(peft_model, world["tok"], loaded.encode(p), 8) for p in prompts]
    assert loaded.generate(prompts, 8) == want
    with torch.no_grad():
        broken = peft_model.generate(input_ids=torch.tensor([loaded.encode(prompts[1])]), max_new_tokens=8,
                                     do_sample=False, pad_token_id=world["tok"].pad_token_id)
    base = plain.generate(prompts, 8)
    assert base != want                                   # the prefix steers the continuations ...
    assert world["tok"].decode(broken[0, len(loaded.encode(prompts[1])):].tolist(),
                               skip_special_tokens=True) == base[1]  # ... which peft's generate loses


def test_dp_prefix_trains_and_records_its_ledger(world):
    d = DPAdapt(method="prefix", epsilon=8.0, prefix_length=4, epochs=1.0, batch_size=8)
    result = d.adapt(_model(world), world["data"], world["ctx"])
    rel, g = result.model, result.guarantee
    assert g["method"] == "prefix" and 0 < g["value"] <= 8.0 and g["accountant"] == "rdp"
    rep = result.report
    assert rep["ledger"]["steps"] == 6 and rep["ledger"]["sigma"] > 0
    assert rep["trainable_params"] == sum(p.numel() for p in rel.peft_model.parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match="grad_sample_mode hooks"):
        DPAdapt(method="prefix", grad_sample_mode="vmap", epochs=1.0, batch_size=8).adapt(
            _model(world), world["data"], world["ctx"])


def test_runner_world_with_dp_prefix(cache, tmp_path):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    suite = parse_suite({
        "name": "tiny-prefix", "seeds": [0],
        "tasks": [{"name": "mini_pile", "params": {"max_chars_per_source": 400_000}}],
        "models": [{"name": "nano", "params": {"pretrain_tokens": 6000, "reference_tokens": 4000}}],
        "defenses": [{"name": "dp_adapt", "params": {"method": "prefix", "epsilon": 8.0, "epochs": 1,
                                                      "prefix_length": 8}}],
        "attacks": ["loss", "min_k"], "games": ["adapt", "null"],
        "world": {"n_per_group": 8, "n_null": 16, "adapt_background": 8},
        "reference": False, "metrics": {"n_boot": 50}, "utility": {"n_heldout": 20},
    })
    store = Store(str(tmp_path / "r.db"))
    result = Runner(suite, store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 4
    (g,) = store.guarantee_rows(result.run_id)
    assert g["defense"] == "dp_adapt" and 0 < g["value"] <= 8.0
    util = {(r["role"], r["metric"]): r["value"] for r in store.utility_rows(result.run_id)}
    # the released prefix model is not the base model: its held-out loss differs
    assert util[("adapted", "loss")] != pytest.approx(util[("pretrained", "loss")], abs=1e-6)


def test_opacus_per_record_gradients_of_the_prefix_are_exact(world):
    """DP needs each record's own gradient: Opacus' hooks on peft's prompt encoder (an nn.Embedding of the
    virtual-token ids, expanded to the batch) must equal per-record autograd gradients."""
    from opacus import GradSampleModule
    from peft import PrefixTuningConfig, get_peft_model

    from defenses.dp import _Collate, record_losses

    peft_model = get_peft_model(_model(world), PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    torch.manual_seed(1)
    for p in peft_model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.3)
    ids, mask = _Collate(world["ctx"].pad_id)(world["ctx"].encode(world["data"].texts[:5], 40))
    (name, param), = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    expected = []
    for r in range(ids.shape[0]):
        peft_model.zero_grad(set_to_none=True)
        logits = peft_model(input_ids=ids[r:r + 1], attention_mask=mask[r:r + 1]).logits
        record_losses(logits, ids[r:r + 1], mask[r:r + 1]).sum().backward()
        expected.append(param.grad.detach().clone())
    peft_model.zero_grad(set_to_none=True)
    gsm = GradSampleModule(peft_model.train(), batch_first=True, loss_reduction="sum")
    record_losses(gsm(input_ids=ids, attention_mask=mask).logits, ids, mask).sum().backward()
    got = param.grad_sample
    assert got.shape == (ids.shape[0], *param.shape)
    for r in range(ids.shape[0]):
        torch.testing.assert_close(got[r], expected[r], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(got[0], got[1])  # records really differ
    gsm._close()
