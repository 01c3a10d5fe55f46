"""GPU-path logic testable on a CPU: device selection, CUDA-OOM batch halving, bf16 policy, signal shards."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bench import device as dev
from bench.errors import ConfigError
from bench.lm import HFLanguageModel, SignalCache
from bench.modeling import ModelSpec, build_scratch_model
from bench.tokenizer import train_bpe_tokenizer

WORDS = "the river quiet stone bird north light table ocean paper green slow window".split()


def _fake_oom(msg: str = "CUDA out of memory. Tried to allocate 2.00 GiB"):
    return torch.OutOfMemoryError(msg)


# -- device selection ------------------------------------------------------------------------------------------
def test_auto_picks_cuda_when_present_else_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dev.select_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dev.select_device("auto") == torch.device("cuda")
    assert dev.select_device("cuda:1") == torch.device("cuda:1")
    assert dev.select_device("cpu") == torch.device("cpu")


def test_cuda_requested_without_cuda_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="use device: auto or cpu"):
        dev.select_device("cuda")


def test_bf16_scoring_is_opt_in_and_never_on_cpu(monkeypatch):
    monkeypatch.setenv("PRIVBENCH_SCORE_BF16", "1")
    assert dev.score_bf16(torch.device("cpu")) is False
    monkeypatch.setattr(dev, "bf16_supported", lambda d: True)
    assert dev.score_bf16(torch.device("cuda")) is True
    monkeypatch.delenv("PRIVBENCH_SCORE_BF16")
    assert dev.score_bf16(torch.device("cuda")) is False


# -- OOM back-off ----------------------------------------------------------------------------------------------
def test_is_oom_recognises_both_error_forms():
    assert dev.is_oom(_fake_oom())
    assert dev.is_oom(RuntimeError("CUDA error: out of memory"))
    assert not dev.is_oom(RuntimeError("shape mismatch"))
    assert not dev.is_oom(ValueError("out of memory"))  # only RuntimeError-family errors are OOMs


def test_backoff_halves_until_the_batch_fits_and_reports_it():
    tried, shrunk = [], []

    def fn(bs):
        tried.append(bs)
        if bs > 5:
            raise _fake_oom()
        return f"ok@{bs}"

    assert dev.run_with_oom_backoff(fn, 48, torch.device("cpu"), on_shrink=shrunk.append) == "ok@3"
    assert tried == [48, 24, 12, 6, 3] and shrunk == [3]


def test_backoff_leaves_a_fitting_batch_alone_and_propagates_other_errors():
    shrunk = []
    assert dev.run_with_oom_backoff(lambda bs: bs, 16, torch.device("cpu"), on_shrink=shrunk.append) == 16
    assert shrunk == []
    calls = []

    def boom(bs):
        calls.append(bs)
        raise RuntimeError("shape mismatch")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        dev.run_with_oom_backoff(boom, 16, torch.device("cpu"))
    assert calls == [16]  # not retried


def test_backoff_gives_up_at_batch_one():
    calls = []

    def never(bs):
        calls.append(bs)
        raise _fake_oom()
    with pytest.raises(torch.OutOfMemoryError):
        dev.run_with_oom_backoff(never, 4, torch.device("cpu"))
    assert calls == [4, 2, 1]


def test_after_a_generation_back_off_later_batches_start_at_the_rows_that_fitted(tiny, monkeypatch):
    """Generation batches are cut before any runs; once CUDA out-of-memory errors have halved a batch, the later
    batches start at the rows that fitted instead of failing again, and the texts are the ones an unlimited run
    gives."""
    tok, model, texts = tiny
    prompts = [" ".join(t.split()[: 1 + i % 4]) for i, t in enumerate(texts[:40])]
    want = HFLanguageModel(model, tok, fingerprint="free", max_length=32, batch_size=1,
                           cache=SignalCache(None)).generate(prompts, 5)
    calls: list[tuple[int, bool]] = []  # (rows, fitted) of every generate call
    original = model.generate

    def limited(*a, **k):
        n = k["input_ids"].shape[0]
        calls.append((n, n <= 4))
        if n > 4:
            raise _fake_oom()
        return original(*a, **k)
    monkeypatch.setattr(model, "generate", limited)
    got = HFLanguageModel(model, tok, fingerprint="tight", max_length=32, batch_size=1,
                          cache=SignalCache(None)).generate(prompts, 5)
    assert got == want
    first_fit = next(i for i, (n, fitted) in enumerate(calls) if fitted and n > 1)
    assert not calls[0][1] and all(fitted for _, fitted in calls[first_fit:])  # the back-off held
    assert sum(n for n, _ in calls[first_fit:] if n > 1) >= len(set(prompts)) - 1  # rows still ran together


def test_release_memory_frees_dropped_models_on_cpu():
    """A dropped model caught in a reference cycle (as a model and its optimizer's hooks often are) is freed."""
    import gc
    import weakref
    gc.disable()
    try:
        model = torch.nn.Linear(4, 4)
        model.cycle = model                 # unreachable once dropped, but only the cycle collector frees it
        alive = weakref.ref(model)
        del model
        assert alive() is not None          # reference counting alone did not free it
        dev.release_memory(torch.device("cpu"))
        assert alive() is None
    finally:
        gc.enable()


# -- scoring with a model that runs out of memory above a batch size -------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) for _ in range(300)]
    d = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(corpus, d, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(str(d))
    spec = ModelSpec("t", num_layers=1, hidden_size=32, num_heads=2, context_length=32, vocab_size=300)
    return tok, build_scratch_model(spec, tok, seed=0).eval(), corpus[:23]


class _OOMAbove(torch.nn.Module):
    """Wraps a model; raises a CUDA-style OOM when a batch has more than ``limit`` rows."""

    def __init__(self, model, limit: int) -> None:
        super().__init__()
        self.inner, self.limit, self.batches = model, limit, []

    def forward(self, input_ids, attention_mask=None, **kw):
        self.batches.append(input_ids.shape[0])
        if input_ids.shape[0] > self.limit:
            raise _fake_oom()
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kw)


def test_scoring_halves_the_batch_on_oom_and_gives_the_same_signals(tiny):
    tok, model, texts = tiny
    plain = HFLanguageModel(model, tok, fingerprint="m", max_length=32, batch_size=4)
    wrapped = _OOMAbove(model, limit=4)
    lm = HFLanguageModel(wrapped, tok, fingerprint="m2", max_length=32, batch_size=16, device=torch.device("cpu"))
    got = lm.token_signals(texts)
    want = plain.token_signals(texts)
    assert lm.batch_size == 4  # remembered for the next call
    assert wrapped.batches[:3] == [16, 8, 4] and max(wrapped.batches[3:]) <= 4
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.token_ids, w.token_ids)
        np.testing.assert_array_equal(g.logprobs, w.logprobs)  # same batches of 4: bit-identical
        np.testing.assert_array_equal(g.sigma2, w.sigma2)


def test_fingerprint_is_computable_without_the_model(tiny):
    tok, model, _ = tiny
    lm = HFLanguageModel(model, tok, fingerprint="k", max_length=32)
    assert lm.fingerprint == HFLanguageModel.fingerprint_for("k", max_length=32, add_bos=True)
    assert lm.fingerprint != HFLanguageModel.fingerprint_for("k", max_length=32, add_bos=True, autocast_bf16=True)


def test_greedy_generations_are_cached_per_prompt_and_survive_a_new_process(tiny, tmp_path):
    """A warm rerun (or a second attack on the same prompts) generates nothing: continuations come from JSON
    shards in the signal cache; a damaged shard is dropped and regenerated, never trusted."""
    tok, model, texts = tiny
    prompts = [t[:20] for t in texts[:6]]
    lm = HFLanguageModel(model, tok, fingerprint="g", max_length=32, cache=SignalCache(tmp_path))
    first = lm.generate(prompts, 5)
    seen: set[tuple[int, ...]] = set()  # every prompt the model was asked to continue (batched or alone)
    original = model.generate

    def counting(*a, **k):
        for row, mask in zip(k["input_ids"].tolist(), k["attention_mask"].tolist()):
            seen.add(tuple(t for t, m in zip(row, mask) if m))
        return original(*a, **k)

    def ids(ps: list[str]) -> set[tuple[int, ...]]:
        return {tuple(lm.encode(p)) for p in ps}
    model.generate = counting
    try:
        again = HFLanguageModel(model, tok, fingerprint="g", max_length=32, cache=SignalCache(tmp_path))
        assert again.generate(prompts, 5) == first and not seen                # all from the shards on disk
        assert again.generate(prompts[:2] + ["a new prompt"], 5)[:2] == first[:2]
        assert seen == ids(["a new prompt"])                                   # only the new prompt
        seen.clear()
        assert again.generate(prompts[:2], 7) and seen == ids(prompts[:2])    # another length is another key
        for shard in (tmp_path / again.fingerprint).glob("gen-*.json"):
            shard.write_text("{not json")
        fresh = HFLanguageModel(model, tok, fingerprint="g", max_length=32, cache=SignalCache(tmp_path))
        seen.clear()
        assert fresh.generate(prompts, 5) == first and seen == ids(prompts)
    finally:
        model.generate = original


# -- signal shards: atomic, verified, shared between processes --------------------------------------------------
def test_truncated_shard_is_never_trusted_and_is_recomputed(tiny, tmp_path):
    tok, model, texts = tiny
    lm = HFLanguageModel(model, tok, fingerprint="s", max_length=32, cache=SignalCache(tmp_path))
    want = lm.token_signals(texts)
    (shard,) = (tmp_path / lm.fingerprint).glob("*.npz")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # what a torn write would leave
    fresh = SignalCache(tmp_path)
    assert fresh.lookup(lm.fingerprint, ["x"]) == {} and not shard.exists()  # dropped, not loaded
    lm2 = HFLanguageModel(model, tok, fingerprint="s", max_length=32, cache=fresh)
    got = lm2.token_signals(texts)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.logprobs, w.logprobs)
    assert len(list((tmp_path / lm.fingerprint).glob("*.npz"))) == 1
    assert not list((tmp_path / lm.fingerprint).glob(".*"))  # no temporary file left


def test_a_lookup_miss_sees_shards_another_process_wrote(tiny, tmp_path):
    tok, model, texts = tiny
    reader = SignalCache(tmp_path)
    lm = HFLanguageModel(model, tok, fingerprint="r", max_length=32, cache=SignalCache(tmp_path))
    fp = lm.fingerprint
    assert reader.lookup(fp, ["nothing"]) == {}  # the reader has scanned (an empty directory)
    sig = lm.token_signals(texts[:3])  # a second cache (another worker) writes a shard
    from bench.hashing import text_hash
    keys = [text_hash(t) for t in texts[:3]]
    found = reader.lookup(fp, keys)
    assert set(found) == set(keys)
    np.testing.assert_array_equal(found[keys[0]].logprobs, sig[0].logprobs)


def test_deterministic_mode_is_opt_in(monkeypatch):
    monkeypatch.delenv("PRIVBENCH_DETERMINISTIC", raising=False)
    assert dev.configure_determinism() is False
    before = torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("PRIVBENCH_DETERMINISTIC", "1")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # records the original value, restored after the test
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    try:
        assert dev.configure_determinism() is True
        assert torch.are_deterministic_algorithms_enabled()
        import os
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before)
