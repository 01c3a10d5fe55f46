"""Shared pieces of the greedy-generation measurement scripts (generation_tie_margin.py, generation_ceiling.py):
a saved model with Names2IDs PII prompts of people no track trains on, plain Hugging Face greedy generation with
the per-step logits, and the comparison of a continuation with a reference one."""

from __future__ import annotations

import torch


def load_probe(model_dir: str, n_prompts: int):
    """(model, tokenizer, token ids of ``n_prompts`` Names2IDs prompts "Name: <name>, ID:", seed 11) on the CPU,
    with privbench's thread setting."""
    from bench.device import set_threads
    from bench.modeling import load_model
    from tasks.names2ids import DEFAULT_LOCALES, PROMPT, make_people

    set_threads()
    model, tok = load_model(model_dir, device=torch.device("cpu"))
    model.eval()
    prompts = [PROMPT.format(name=p["name"]) for p in make_people(n_prompts, DEFAULT_LOCALES, 11)]
    return model, tok, [tok(p)["input_ids"] for p in prompts]


def eos_ids(model) -> set[int]:
    """The token ids that end a greedy continuation (the model's generation config)."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])


@torch.no_grad()
def greedy(model, tok, rows: list[list[int]], new_tokens: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy continuations of ``rows`` (left-padded when their lengths differ), each cut after its first EOS,
    and the fp32 logits of every step (rows × steps × vocabulary)."""
    from bench.lm import left_padded

    ids, mask, _ = left_padded(rows, tok.pad_token_id, torch.device("cpu"))
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=tok.pad_token_id, output_scores=True, return_dict_in_generate=True)
    eos = eos_ids(model)
    seqs = []
    for row in out.sequences[:, ids.shape[1]:].tolist():
        stop = next((j for j, t in enumerate(row) if t in eos), None)
        seqs.append(row if stop is None else row[:stop + 1])
    return seqs, torch.stack(out.scores, 1).float()


def agreement(seq: list[int], scores: torch.Tensor, ref: list[int], ref_scores: torch.Tensor) -> tuple[bool, float]:
    """(whether ``seq`` differs from ``ref``, the largest logit difference over the steps where they agree)."""
    n = min(len(seq), len(ref))
    agree = next((k for k in range(n) if seq[k] != ref[k]), n)
    shift = float((scores[:agree] - ref_scores[:agree]).abs().max()) if agree else 0.0
    return seq != ref, shift
