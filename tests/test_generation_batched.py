"""Batched greedy generation (``HFLanguageModel.generate``) returns, for every prompt, the text Hugging Face's
``generate`` gives for that prompt alone: prompts of mixed lengths (in one left-padded batch or several),
duplicates, continuations that stop at EOS, and any batch size."""

from __future__ import annotations

import pytest
import torch

from bench.lm import GREEDY_TIE_MARGIN, HFLanguageModel, SignalCache
from bench.modeling import ModelSpec, build_scratch_model
from bench.tokenizer import train_bpe_tokenizer
from bench.training import train_causal_lm
from tests.worlds import synthetic_corpus

MAX_LEN = 64
NEW = 16


@pytest.fixture(scope="module")
def model_and_tok(tmp_path_factory):
    from transformers import AutoTokenizer
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gen")
    corpus = synthetic_corpus(300, seed=5)
    train_bpe_tokenizer(corpus, root / "bpe", vocab_size=512)
    tok = AutoTokenizer.from_pretrained(str(root / "bpe"))
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=MAX_LEN, vocab_size=512,
                     autocast_bf16=False, score_batch_size=16)
    model = build_scratch_model(spec, tok, seed=0)
    # every text ends in EOS, so a trained model stops some continuations early
    seqs = [([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"])[:MAX_LEN - 1] + [tok.eos_token_id]
            for t in corpus]
    train_causal_lm(model, seqs, epochs=6, lr=3e-3, batch_size=8, seed=0, pad_id=tok.pad_token_id, progress=False)
    return model.eval(), tok, corpus


def _alone(model, tok, prompt: str) -> str:
    ids = torch.tensor([[tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_batched_generation_equals_one_prompt_at_a_time(model_and_tok, batch_size):
    model, tok, corpus = model_and_tok
    prompts = [" ".join(t.split()[: 1 + i % 7]) for i, t in enumerate(corpus[:80])]
    prompts += prompts[:10]  # duplicates: generated once, returned for each
    lm = HFLanguageModel(model, tok, fingerprint=f"gen-{batch_size}", max_length=MAX_LEN, batch_size=batch_size,
                         cache=SignalCache(None))
    got = lm.generate(prompts, NEW)
    want = [_alone(model, tok, p) for p in prompts]
    assert got == want
    assert len({len(tok(p)["input_ids"]) for p in prompts}) >= 5  # several length groups
    # some continuation stopped at EOS before NEW tokens (its batch neighbours went on): padding was dropped
    assert any(len(tok(g, add_special_tokens=False)["input_ids"]) < NEW - 2 for g in want)


def test_prompts_of_different_lengths_share_a_left_padded_batch(model_and_tok, monkeypatch):
    """Length-sorted batches mix prompt lengths (the shorter rows left-padded, their positions taken from the
    mask), and every continuation is still the one the prompt gets alone."""
    model, tok, corpus = model_and_tok
    prompts = [" ".join(t.split()[: 1 + i % 9]) for i, t in enumerate(corpus[100:160])]
    padded_rows: list[int] = []
    generate = model.generate

    def watch(**kw):
        padded_rows.append(int((kw["attention_mask"] == 0).any(dim=1).sum()))
        return generate(**kw)
    monkeypatch.setattr(model, "generate", watch)
    got = HFLanguageModel(model, tok, fingerprint="mixed", max_length=MAX_LEN, batch_size=64,
                          cache=SignalCache(None)).generate(prompts, NEW)
    monkeypatch.setattr(model, "generate", generate)
    assert got == [_alone(model, tok, p) for p in prompts]
    assert len({len(tok(p)["input_ids"]) for p in prompts}) >= 5
    assert padded_rows[0] > 0  # the first batch held several lengths: its shorter rows were padded


def test_generations_are_cached_and_not_recomputed(model_and_tok, tmp_path):
    model, tok, corpus = model_and_tok
    prompts = [" ".join(t.split()[:3]) for t in corpus[:12]]
    cache = SignalCache(tmp_path / "signals")
    first = HFLanguageModel(model, tok, fingerprint="cached", max_length=MAX_LEN, cache=cache).generate(prompts, NEW)

    class NoGenerate(torch.nn.Module):  # the model a warm call must never run
        def generate(self, **kwargs):
            raise AssertionError("generated again although every prompt was cached")

    warm = HFLanguageModel(NoGenerate(), tok, fingerprint="cached", max_length=MAX_LEN, device=torch.device("cpu"),
                           cache=SignalCache(tmp_path / "signals"))
    assert warm.generate(prompts, NEW) == first


def test_a_near_tie_is_decided_as_an_unbatched_call_decides_it(model_and_tok, monkeypatch):
    """Batching may round logits differently; where the top two come closer than GREEDY_TIE_MARGIN the row is
    generated again on its own. Here the runner-up token is put 1e-5 from the best: alone it wins, in a batch it
    loses, as a rounding difference could make it."""
    model, tok, corpus = model_and_tok
    prompts = [" ".join(t.split()[:2]) for t in corpus[:24]]
    original = model.forward

    def near_tie(*args, **kw):
        out = original(*args, **kw)
        last = out.logits[:, -1]
        top = last.topk(2, dim=-1).indices
        r = torch.arange(last.shape[0])
        last[r, top[:, 1]] = last[r, top[:, 0]] + (1e-5 if last.shape[0] == 1 else -1e-5)
        return out
    monkeypatch.setattr(model, "forward", near_tie)
    assert 1e-5 < GREEDY_TIE_MARGIN
    want = [_alone(model, tok, p) for p in prompts]
    rows: list[int] = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: (rows.append(kw["input_ids"].shape[0]), generate(**kw))[1])
    got = HFLanguageModel(model, tok, fingerprint="tie", max_length=MAX_LEN, batch_size=64,
                          cache=SignalCache(None)).generate(prompts, NEW)
    assert got == want
    assert max(rows) > 1 and rows.count(1) >= len(set(prompts)) - len({len(tok(p)["input_ids"]) for p in prompts})


def _close_call_at_first_step(model, monkeypatch, alone_gap: float, batched_gap: float) -> None:
    """Make every prompt's first generated step a close call (the runner-up ``alone_gap`` above or below the best
    when a prompt runs alone, ``batched_gap`` in a batch); later steps are left as the model computes them."""
    original = model.forward

    def first_step_close(*args, **kw):
        out = original(*args, **kw)
        if kw["input_ids"].shape[1] > 1:  # the prompt's pass (every prompt here has 2 or more tokens)
            last = out.logits[:, -1]
            top = last.topk(2, dim=-1).indices
            r = torch.arange(last.shape[0])
            last[r, top[:, 1]] = last[r, top[:, 0]] + (alone_gap if last.shape[0] == 1 else batched_gap)
        return out
    monkeypatch.setattr(model, "forward", first_step_close)


def _generate_recording_alone_steps(model, tok, prompts, monkeypatch) -> tuple[list[str], list[int]]:
    """``HFLanguageModel.generate`` on ``prompts``, and the new tokens of every call that ran one prompt alone."""
    steps: list[int] = []
    generate = model.generate

    def watch(**kw):
        out = generate(**kw)
        if kw["input_ids"].shape[0] == 1:
            steps.append(out.shape[1] - kw["input_ids"].shape[1])
        return out
    monkeypatch.setattr(model, "generate", watch)
    got = HFLanguageModel(model, tok, fingerprint="close", max_length=MAX_LEN,
                          batch_size=64, cache=SignalCache(None)).generate(prompts, NEW)
    monkeypatch.setattr(model, "generate", generate)
    return got, steps


def test_a_close_call_the_prompt_alone_confirms_stops_the_alone_run_after_it(model_and_tok, monkeypatch):
    """Only the first step is close and the prompt alone picks the batched token there: the alone run stops after
    that step and the batched row's later steps stand, which is what the prompt alone gives in full."""
    model, tok, corpus = model_and_tok
    prompts = [" ".join(t.split()[: 1 + i % 5]) for i, t in enumerate(corpus[:30])]
    _close_call_at_first_step(model, monkeypatch, alone_gap=-5e-4, batched_gap=-4e-4)  # the best stays best
    want = [_alone(model, tok, p) for p in prompts]
    got, steps = _generate_recording_alone_steps(model, tok, prompts, monkeypatch)
    assert got == want
    assert len(steps) == len(set(prompts))  # every row went back (all shared batches: no row ran alone at first)
    assert max(steps) == 1  # each stopped after the close call
    assert any(len(tok(w, add_special_tokens=False)["input_ids"]) > 1 for w in want)  # the rest came from batches


def test_a_close_call_the_prompt_alone_decides_otherwise_runs_alone_to_the_end(model_and_tok, monkeypatch):
    """The first step is close and the prompt alone picks the runner-up: it goes on alone to the end, and the
    continuation is the alone one, not the batched row's."""
    model, tok, corpus = model_and_tok
    prompts = [" ".join(t.split()[: 1 + i % 5]) for i, t in enumerate(corpus[:30])]
    _close_call_at_first_step(model, monkeypatch, alone_gap=1e-5, batched_gap=-1e-5)
    want = [_alone(model, tok, p) for p in prompts]
    got, steps = _generate_recording_alone_steps(model, tok, prompts, monkeypatch)
    assert got == want
    assert max(steps) > 1


class _PadIsAWord:
    """The tokenizer with an ordinary word as its pad token (not a special token, so decoding keeps it)."""

    def __init__(self, tok, pad_id: int) -> None:
        self._tok, self.pad_token_id = tok, pad_id

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *args, **kw):
        return self._tok(*args, **kw)


def test_rows_finished_early_are_cut_at_eos_whatever_the_pad_token(model_and_tok):
    """Hugging Face fills a finished row with the pad token while the batch goes on; a call on that prompt alone
    stops at EOS. A continuation must never show the padding, even where decoding would keep the pad token."""
    model, tok, corpus = model_and_tok
    word = next(i for i in tok(corpus[0], add_special_tokens=False)["input_ids"] if i not in tok.all_special_ids)
    padded = _PadIsAWord(tok, word)
    prompts = [" ".join(t.split()[: 1 + i % 7]) for i, t in enumerate(corpus[:80])]
    want = [_alone(model, padded, p) for p in prompts]
    assert any(len(tok(g, add_special_tokens=False)["input_ids"]) < NEW - 2 for g in want)  # some stopped early
    got = HFLanguageModel(model, padded, fingerprint="pad", max_length=MAX_LEN, batch_size=64,
                          cache=SignalCache(None)).generate(prompts, NEW)
    assert got == want


def test_library_generate_is_greedy_decoding_by_the_forward_pass(model_and_tok):
    """The reference above is Hugging Face's ``generate``; this pins it to its definition, an argmax of the forward
    pass at each step, so a library change that drops state between steps (as peft's prefix under transformers 5
    did, tests/test_prefix.py) cannot hide behind a comparison with itself."""
    model, tok, corpus = model_and_tok
    compared = 0
    for text in corpus[:12]:
        prompt = " ".join(text.split()[:3])
        ids = torch.tensor([[tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]])
        cur = ids
        for _ in range(NEW):
            with torch.no_grad():
                top = model(input_ids=cur).logits[0, -1].topk(2)
            if float(top.values[0] - top.values[1]) < GREEDY_TIE_MARGIN:
                break  # a near tie: the cached and the recomputed pass may round it either way; compare up to here
            cur = torch.cat([cur, top.indices[:1][None]], 1)
            compared += 1
            if int(top.indices[0]) == tok.eos_token_id:
                break
        want = tok.decode(cur[0, ids.shape[1]:], skip_special_tokens=True)
        assert _alone(model, tok, prompt).startswith(want)
    assert compared >= 60  # most steps were compared
