"""Utility of a released model, measured the same way for every defense.

Held-out loss, perplexity and next-token accuracy come from the per-token signals the attacks use (one cached
forward pass). ROUGE-1 and ROUGE-L (ROUGE-1 in Marek et al. 2026, ROUGE-L in GUARD, anonymous preprint 2025) score a
generation task that every model can do without instructions: continue a held-out record from its first
``prompt_tokens`` tokens by greedy decoding, and compare the continuation with the record's true next
``max_new_tokens`` tokens. The papers summarise SAMSum dialogues; a tiny model trained from scratch cannot follow a
summarisation prompt, so continuation is the offline stand-in (with a hub dataset the same function scores any
prompt/reference pairs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.hashing import content_hash
from bench.lm import LanguageModel


def heldout_metrics(lm: LanguageModel, texts: Sequence[str]) -> tuple[dict[str, float], int]:
    """Token-weighted loss (nats/token), perplexity and next-token accuracy on ``texts``; and the token count."""
    sig = lm.token_signals(list(texts))
    n_tok = int(sum(x.n_tokens for x in sig))
    total = float(sum(-x.logprobs.astype(np.float64).sum() for x in sig))
    loss = total / max(n_tok, 1)
    hits = int(sum(int(x.top1.sum()) for x in sig))
    return {"loss": loss, "perplexity": float(np.exp(min(loss, 50.0))),
            "next_token_accuracy": hits / max(n_tok, 1)}, n_tok


def continuation_pairs(lm: LanguageModel, texts: Sequence[str], prompt_tokens: int,
                       max_new_tokens: int) -> list[tuple[str, str]]:
    """(prompt, reference) pairs: a record's first tokens, and its next ``max_new_tokens`` tokens.

    Records too short to leave at least half a reference are skipped, so short records do not score
    an empty reference.
    """
    pairs = []
    for t in texts:
        prompt, rest = lm.split_at_token(t, prompt_tokens)
        ref, _ = lm.split_at_token(rest, max_new_tokens)
        if prompt.strip() and len(ref.split()) >= 2 and lm.split_at_token(rest, max_new_tokens // 2)[1]:
            pairs.append((prompt, ref))
    return pairs


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1 and ROUGE-L F-measure (Google's ``rouge-score``, the ROUGE-1.5.5 reimplementation)."""
    from rouge_score import rouge_scorer
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        return {"rouge1": float("nan"), "rougeL": float("nan")}
    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)
    r1, rl = [], []
    for p, r in zip(predictions, references):
        s = scorer.score(r, p)  # score(target, prediction)
        r1.append(s["rouge1"].fmeasure)
        rl.append(s["rougeL"].fmeasure)
    return {"rouge1": float(np.mean(r1)), "rougeL": float(np.mean(rl))}


def generation_metrics(lm: LanguageModel, texts: Sequence[str], *, n: int, prompt_tokens: int,
                       max_new_tokens: int, cache_dir: Path | None = None,
                       read_only_dirs: Sequence[Path] = ()) -> dict[str, float]:
    """ROUGE-1 / ROUGE-L of greedy continuations of the first ``n`` usable held-out records.

    Greedy generations are deterministic for a given model, so with ``cache_dir`` they are stored by
    (model fingerprint, prompts, length) and a rerun generates nothing. ``read_only_dirs`` are looked in too
    (after ``cache_dir``) and never written.
    """
    pairs = continuation_pairs(lm, texts, prompt_tokens, max_new_tokens)[:n]
    if not pairs:
        return {}
    prompts = [p for p, _ in pairs]
    outs = None
    path = None
    fp = getattr(lm, "fingerprint", None)
    if cache_dir is not None and fp:
        name = f"{content_hash(fp, prompts, max_new_tokens)}.json"
        path = Path(cache_dir) / name
        for found in [path] + [Path(d) / name for d in read_only_dirs]:
            if outs is not None or not found.is_file():
                continue
            try:
                outs = json.loads(found.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                outs = None  # a damaged entry is regenerated
            if not isinstance(outs, list) or len(outs) != len(prompts):
                outs = None
    if outs is None:
        outs = lm.generate(prompts, max_new_tokens)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(outs), encoding="utf-8")
            os.replace(tmp, path)  # write-then-rename: a killed run leaves no half-written entry
    scores = rouge_scores(outs, [r for _, r in pairs])
    scores["n_generated"] = float(len(pairs))
    return scores
