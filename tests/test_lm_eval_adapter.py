"""privbench's LanguageModel registered with lm-eval: local YAML tasks score any released model offline."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from bench.lm import HFLanguageModel
from bench.modeling import ModelSpec, build_scratch_model
from bench.tokenizer import train_bpe_tokenizer

MAX_LEN = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta river stone light night cloud rain".split()
    corpus = [" ".join(rng.choice(words, size=30)) for _ in range(200)]
    tok_dir = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(corpus, tok_dir, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    spec = ModelSpec("t", num_layers=2, hidden_size=32, num_heads=2, context_length=MAX_LEN, vocab_size=300)
    model = build_scratch_model(spec, tok, seed=0).eval()
    lm = HFLanguageModel(model, tok, fingerprint="lm-eval-test", max_length=MAX_LEN, batch_size=4)
    return {"lm": lm, "model": model, "tok": tok, "words": words, "rng": rng}


def _doc_logprob(model, tok, text: str) -> float:
    """log p(text | BOS) in one float64 pass, for texts that fit the window (independent of privbench)."""
    ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) <= MAX_LEN
    with torch.no_grad():
        logp = torch.log_softmax(model.double()(torch.tensor([ids])).logits[0, :-1], -1)
    model.float()
    return float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())


def test_requests_are_answered_from_the_model(tiny):
    from lm_eval.api.instance import Instance

    from bench.lm_eval_adapter import PrivbenchLM
    lm, model, tok = tiny["lm"], tiny["model"], tiny["tok"]
    adapter = PrivbenchLM(lm)
    short = "alpha beta gamma delta"
    req = [Instance("loglikelihood_rolling", {}, (short,), 0)]
    assert adapter.loglikelihood_rolling(req)[0] == pytest.approx(_doc_logprob(model, tok, short), abs=1e-4)
    # a document longer than the window is scored in chunks, every token once: its total is finite and
    # lower than the first chunk's alone
    long = " ".join(tiny["rng"].choice(tiny["words"], size=120))
    assert len(tok(long)["input_ids"]) > 2 * MAX_LEN
    total = adapter.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (long,), 0)])[0]
    assert np.isfinite(total) and total < adapter.loglikelihood_rolling([Instance(
        "loglikelihood_rolling", {}, (" ".join(long.split()[:10]),), 0)])[0]
    # conditional log-likelihood = log p(context + continuation) - log p(context) when tokens do not straddle
    (ll, greedy), = adapter.loglikelihood([Instance("loglikelihood", {}, ("alpha beta", " gamma"), 0)])
    want = _doc_logprob(model, tok, "alpha beta gamma") - _doc_logprob(model, tok, "alpha beta")
    assert ll == pytest.approx(want, abs=1e-4)
    assert isinstance(greedy, bool)
    # generation stops at the first stop sequence
    full = lm.generate(["alpha beta"], 12)[0]
    stop = full.strip().split(" ")[0]
    out = adapter.generate_until([Instance("generate_until", {}, ("alpha beta", {"until": [stop],
                                                                               "max_gen_toks": 12}), 0)])[0]
    assert stop not in out and full.startswith(out)


def test_local_yaml_task_through_simple_evaluate(tiny, tmp_path, monkeypatch):
    from bench.lm_eval_adapter import evaluate
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    docs = [" ".join(tiny["rng"].choice(tiny["words"], size=12)) for _ in range(6)]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "tiny_ppl.yaml").write_text(
        "task: privbench_tiny_ppl\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: loglikelihood_rolling\n"
        "doc_to_text: ''\n"
        "doc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    res = evaluate(tiny["lm"], ["privbench_tiny_ppl"], include_path=tmp_path)["privbench_tiny_ppl"]
    lp = [_doc_logprob(tiny["model"], tiny["tok"], d) for d in docs]
    n_words = sum(len(d.split()) for d in docs)
    n_bytes = sum(len(d.encode()) for d in docs)
    assert res["word_perplexity,none"] == pytest.approx(np.exp(-sum(lp) / n_words), rel=1e-3)
    assert res["bits_per_byte,none"] == pytest.approx(-sum(lp) / n_bytes / np.log(2), rel=1e-3)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
