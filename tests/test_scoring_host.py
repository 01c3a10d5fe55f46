"""The host side of scoring (tokenising a list at once, padding, moving statistics off the device once per batch)
changes no bit of any signal: each piece against the per-text, per-row code it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.lm import HFLanguageModel, TokenSignals, right_padded, signals_from_stats
from bench.logit_stats import BLOCK_ELEMENTS, CUDA_BLOCK_ELEMENTS, _blocks, block_elements

TEXTS = ["", "a", "The quick brown fox.", "def f(x):\n    return x ** 2\n", "Ünïcödé — ∑ and 漢字 too", " lead space",
         "trailing  double  spaces  ", "word " * 300]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A byte-level BPE as the runner trains for its scratch models (bench.tokenizer)."""
    from transformers import AutoTokenizer

    from bench.tokenizer import train_bpe_tokenizer
    corpus = [f"line {i}: the cat sat on mat number {i * 7 % 13}; def f{i}(x): return x + {i}" for i in range(400)]
    out = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(corpus, out, vocab_size=300)
    return AutoTokenizer.from_pretrained(out)


def _one_at_a_time(tokenizer, texts, *, max_length: int, add_bos: bool) -> list[list[int]]:
    """The per-text encoding scoring used before: one tokenizer call per text, BOS, then truncation."""
    bos = [tokenizer.bos_token_id] if add_bos else []
    return [(bos + tokenizer(t, add_special_tokens=False)["input_ids"])[:max_length] for t in texts]


def _lm(tokenizer, *, max_length: int, add_bos: bool = True) -> HFLanguageModel:
    model = torch.nn.Linear(1, 1)  # only the tokenizer side is exercised
    return HFLanguageModel(model, tokenizer, fingerprint="host-side", max_length=max_length, add_bos=add_bos)


@pytest.mark.parametrize("max_length", [4, 64, 1024])
@pytest.mark.parametrize("add_bos", [True, False])
def test_encode_many_equals_encoding_one_text_at_a_time(tokenizer, max_length, add_bos):
    lm = _lm(tokenizer, max_length=max_length, add_bos=add_bos)
    ref = _one_at_a_time(tokenizer, TEXTS, max_length=max_length, add_bos=add_bos)
    assert lm.encode_many(TEXTS) == ref and [lm.encode(t) for t in TEXTS] == ref
    assert lm.encode_many([]) == []
    assert any(len(e) == max_length for e in lm.encode_many(TEXTS))  # truncation is exercised


def test_encode_many_equals_one_at_a_time_for_smollm2():
    """The realistic track's tokenizer (GPT-2-style BPE read from the GGUF file)."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from bench.errors import ConfigError
    from bench.modeling import resolve_spec
    try:
        spec = resolve_spec("smollm2-135m", {})
    except ConfigError as exc:
        pytest.skip(str(exc))
    tok = AutoTokenizer.from_pretrained(spec.hf_id, gguf_file=spec.gguf_file)
    lm = _lm(tok, max_length=128)
    ref = _one_at_a_time(tok, TEXTS, max_length=128, add_bos=lm.add_bos)
    assert lm.encode_many(TEXTS) == ref and [lm.encode(t) for t in TEXTS] == ref


def _right_padded_per_row(seqs, pad):
    """The construction right_padded replaced: one tensor per row."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    return ids, mask


def test_right_padded_equals_the_per_row_construction():
    seqs = [[5, 6, 7, 8], [1], [2, 3], [9, 9, 9, 9]]
    ids, mask = right_padded(seqs, 0, torch.device("cpu"))
    ref_ids, ref_mask = _right_padded_per_row(seqs, 0)
    assert ids.dtype == mask.dtype == torch.long
    assert torch.equal(ids, ref_ids) and torch.equal(mask, ref_mask)
    assert torch.equal(right_padded([[3]], 7, torch.device("cpu"))[0], torch.tensor([[3]]))


def _signals_per_row(stats, tgt, spans):
    """The splitting signals_from_stats replaced: six device-to-host copies per row."""
    tok_lp, mu, sigma2, top1, top1_lp = stats
    return [TokenSignals(token_ids=tgt[r, sl].cpu().numpy().astype(np.int32),
                         logprobs=tok_lp[r, sl].cpu().numpy().astype(np.float32),
                         mu=mu[r, sl].cpu().numpy().astype(np.float32),
                         sigma2=sigma2[r, sl].clamp_min(0).cpu().numpy().astype(np.float32),
                         top1=top1[r, sl].cpu().numpy().astype(np.int8),
                         top1_logprob=top1_lp[r, sl].cpu().numpy().astype(np.float32))
            for r, sl in enumerate(spans)]


def test_signals_from_stats_equals_the_per_row_split_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    batch, length = 5, 9
    sigma2 = torch.rand(batch, length, generator=g)
    sigma2[0, :3] = torch.tensor([-1e-9, -0.0, 0.0])  # rounding below zero and a negative zero: clamped as before
    stats = (torch.randn(batch, length, generator=g), torch.randn(batch, length, generator=g), sigma2,
             torch.rand(batch, length, generator=g) > 0.5, torch.randn(batch, length, generator=g))
    tgt = torch.randint(0, 1000, (batch, length), generator=g)
    spans = [slice(0, 9), slice(2, 5), slice(0, 0), slice(1, 8), slice(8, 9)]
    got, ref = signals_from_stats(stats, tgt, spans), _signals_per_row(stats, tgt, spans)
    for a, b in zip(got, ref):
        for field in ("token_ids", "logprobs", "mu", "sigma2", "top1", "top1_logprob"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), field
            assert x.flags.owndata  # each row owns its memory: no view that keeps the whole batch alive
    assert np.signbit(got[0].sigma2[1]) == np.signbit(ref[0].sigma2[1])


def test_gpu_blocks_are_larger_and_still_tile_the_grid():
    assert block_elements(torch.device("cpu")) == BLOCK_ELEMENTS
    assert block_elements(torch.device("cuda")) == CUDA_BLOCK_ELEMENTS > BLOCK_ELEMENTS
    batch, length, vocab = 256, 511, 32_000
    cpu, gpu = _blocks(batch, length, vocab), _blocks(batch, length, vocab, CUDA_BLOCK_ELEMENTS)
    assert len(gpu) * 100 < len(cpu)
    covered = np.zeros((batch, length), dtype=int)
    for rows, positions in gpu:
        covered[rows, positions] += 1
    assert (covered == 1).all()


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_pipelined_scoring_equals_scoring_one_batch_after_another(tokenizer, device):
    """The scoring loop cuts batch i into rows only after batch i + 1 is queued (bench.lm.stats_to_host; on a GPU
    the copies are asynchronous) and calls the model without a key/value cache: the signals, and which text each
    lands on, equal the loop that finishes each batch before the next with the model's default call."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from bench.lm import stats_from_logits
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=False)
    dev = torch.device(device)
    model = GPTNeoXForCausalLM(cfg).eval().to(dev)
    lm = HFLanguageModel(model, tokenizer, fingerprint="pipelined", max_length=64, batch_size=3, device=dev)
    texts = [t for t in TEXTS if t] + ["the cat sat", "def f7(x): return x + 7", "mat number 5"]
    keys = [f"k{i}" for i in range(len(texts))]
    got = lm._compute_signals(keys, texts)
    encoded = lm.encode_many(texts)
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
    ref = {}
    with torch.no_grad():
        for b in range(0, len(order), 3):
            batch = order[b:b + 3]
            ids, mask = right_padded([encoded[i] for i in batch], tokenizer.pad_token_id, dev)
            # the model's default call (it builds a key/value cache, which scoring skips): the same logits
            stats = stats_from_logits(model(input_ids=ids, attention_mask=mask).logits[:, :-1], ids[:, 1:])
            spans = [slice(0, len(encoded[i]) - 1) for i in batch]
            ref.update(zip((keys[i] for i in batch), signals_from_stats(stats, ids[:, 1:], spans)))
    assert len(order) > 2 * 3 and set(got) == set(ref) == set(keys)  # several batches, every text once
    for k in keys:
        for field in ("token_ids", "logprobs", "mu", "sigma2", "top1", "top1_logprob"):
            assert getattr(got[k], field).tobytes() == getattr(ref[k], field).tobytes(), (k, field)


def _fixed_chunks(order, batch_size):
    return [list(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]


@pytest.mark.parametrize("seed", range(6))
def test_scoring_batches_keep_every_rows_padded_length(seed):
    """Joining chunks changes how many rows a forward pass holds, never the length a row is padded to, and stays
    within the token budget (the memory bound of one batch_size × max_length batch)."""
    from bench.lm import scoring_batches
    rng = np.random.default_rng(seed)
    lengths = list(rng.choice([1, 2, 3, 9, 9, 9, 17, 64], size=int(rng.integers(1, 300))))
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch_size, max_length = int(rng.integers(1, 9)), 64
    budget = batch_size * max_length
    chunks = _fixed_chunks(order, batch_size)
    padded = {i: max(lengths[j] for j in c) for c in chunks for i in c}
    got = scoring_batches(order, lengths, batch_size, budget)
    assert [i for b in got for i in b] == order
    for b in got:
        width = max(lengths[i] for i in b)
        assert all(padded[i] == width for i in b)
        assert len(b) <= batch_size or len(b) * width <= budget
    # chunks of one padded length are joined as far as the budget allows: where a batch of the same padded length
    # follows another, its first chunk did not fit
    for a, b in zip(got, got[1:]):
        wa, wb = max(lengths[i] for i in a), max(lengths[i] for i in b)
        assert wa != wb or (len(a) + min(batch_size, len(b))) * wa > budget


def test_short_texts_share_a_forward_pass_and_score_as_in_fixed_chunks(tokenizer, monkeypatch):
    """Many short texts (exposure references, Names2IDs records) are scored many chunks to a forward pass; every
    signal equals scoring one batch_size chunk at a time (within 1e-6: a forward pass of more rows may use
    another matrix-product kernel; on the reference CPUs the bits were the same, docs/benchmarks.md)."""
    import bench.lm as lm_module
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=False)
    model = GPTNeoXForCausalLM(cfg).eval()
    texts = [f"line {i}: the cat" for i in range(40)] + [f"mat number {i % 13}" for i in range(30)] + TEXTS[1:]
    keys = [f"k{i}" for i in range(len(texts))]
    seen: list[int] = []
    real = lm_module.scoring_batches

    def spy(*args):
        batches = real(*args)
        seen.extend(len(b) for b in batches)
        return batches

    monkeypatch.setattr(lm_module, "scoring_batches", spy)
    got = HFLanguageModel(model, tokenizer, fingerprint="joined", max_length=64, batch_size=4)._compute_signals(
        keys, texts)
    assert max(seen) > 4 and sum(seen) == len(texts)  # joined: more rows than batch_size in one pass
    monkeypatch.setattr(lm_module, "scoring_batches", lambda order, lengths, bs, budget: _fixed_chunks(order, bs))
    ref = HFLanguageModel(model, tokenizer, fingerprint="chunks", max_length=64, batch_size=4)._compute_signals(
        keys, texts)
    for k in keys:
        for field in ("token_ids", "top1"):
            assert np.array_equal(getattr(got[k], field), getattr(ref[k], field)), (k, field)
        for field in ("logprobs", "mu", "sigma2", "top1_logprob"):
            np.testing.assert_allclose(getattr(got[k], field), getattr(ref[k], field), rtol=0, atol=1e-6)
