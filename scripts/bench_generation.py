"""Greedy generation throughput: privbench's batched ``HFLanguageModel.generate`` against one ``generate`` call per
prompt (what it did before), on the same prompts, with a check that both return the same texts.

A model of a built-in spec and a byte-level BPE tokenizer, both trained briefly on the repository's docs (a
random-weight model's logits are nearly flat, so most of its greedy steps are near ties that the batched path
must decide one row at a time, which no released model shows); prompts are the first 4-15 tokens of the docs'
lines (several length groups, as extraction prompts have). Not a test: run it on an otherwise idle machine and
record the output in docs/benchmarks.md.

    python scripts/bench_generation.py [--spec nano] [--prompts 256] [--new-tokens 24] [--device cpu]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="nano")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--train-epochs", type=float, default=2.0, help="epochs on the docs before generating (0: "
                    "random weights)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from bench.device import set_threads
    from bench.lm import HFLanguageModel
    from bench.modeling import BUILTIN_SPECS, build_scratch_model
    from bench.tokenizer import train_bpe_tokenizer
    from bench.training import train_causal_lm

    set_threads()
    lines = [ln.strip() for p in sorted((ROOT / "docs").glob("*.md")) for ln in p.read_text().splitlines()
             if len(ln.split()) > 8]
    spec = BUILTIN_SPECS[a.spec]
    with tempfile.TemporaryDirectory() as tmp:
        train_bpe_tokenizer(lines, Path(tmp), vocab_size=spec.vocab_size)
        tok = AutoTokenizer.from_pretrained(tmp)
    device = torch.device(a.device)
    model = build_scratch_model(spec, tok, seed=0).to(device)
    if a.train_epochs > 0:
        seqs = [([tok.bos_token_id] + tok(ln, add_special_tokens=False)["input_ids"])[: spec.context_length]
                for ln in lines]
        train_causal_lm(model, seqs, epochs=a.train_epochs, lr=2e-3, batch_size=16, seed=0, pad_id=tok.pad_token_id,
                        device=device, progress=False)
    model.eval()
    prompts = []
    for i, ln in enumerate(lines[: a.prompts]):
        ids = tok(ln, add_special_tokens=False)["input_ids"][: 4 + i % 12]
        prompts.append(tok.decode(ids))

    def one(p: str) -> str:
        ids = torch.tensor([[tok.bos_token_id] + tok(p, add_special_tokens=False)["input_ids"]], device=device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens,
                             do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    lm = HFLanguageModel(model, tok, fingerprint="bench-generation", max_length=spec.context_length,
                         batch_size=a.batch_size, device=device)
    sent_back = []  # rows the tie margin generated again on their own
    greedy = lm._greedy
    lm._greedy = lambda ids, n, gaps=None: (sent_back.append(ids.shape[0]) if gaps is None else None,
                                            greedy(ids, n, gaps))[1]
    with torch.no_grad():
        one(prompts[0])  # warm-up
        t0 = time.perf_counter()
        alone = [one(p) for p in prompts]
        t1 = time.perf_counter()
        batched = lm.generate(prompts, a.new_tokens)
        t2 = time.perf_counter()
        shift = _batching_shift(model, tok, prompts, device)
    n_lengths = len({len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts})
    same = sum(x == y for x, y in zip(alone, batched))
    print(f"{a.spec} ({a.train_epochs:g} epochs on the docs) on {device} ({torch.get_num_threads()} threads), "
          f"{len(prompts)} prompts of {n_lengths} lengths, {a.new_tokens} new tokens, batch {a.batch_size}:")
    print(f"  one prompt at a time: {len(prompts) / (t1 - t0):8.1f} prompts/s")
    print(f"  batched by length:    {len(prompts) / (t2 - t1):8.1f} prompts/s  ({(t1 - t0) / (t2 - t1):.1f}x)")
    print(f"  same text: {same} of {len(prompts)}")
    print(f"  batching moved last-position logits by at most {shift[0]:.2e}, the top-two gap by at most "
          f"{shift[1]:.2e}; rows generated again alone (gap < GREEDY_TIE_MARGIN): {len(sent_back)}")


def _batching_shift(model, tok, prompts: list[str], device) -> tuple[float, float]:
    """Largest change, batched against alone, of the prompts' last-position logits and of their top-two gap."""
    by_len: dict[int, list[list[int]]] = {}
    for p in prompts:
        ids = [tok.bos_token_id] + tok(p, add_special_tokens=False)["input_ids"]
        by_len.setdefault(len(ids), []).append(ids)
    worst_logit = worst_gap = 0.0
    for group in by_len.values():
        if len(group) < 2:
            continue
        together = model(input_ids=torch.tensor(group, device=device)).logits[:, -1].float()
        alone = torch.cat([model(input_ids=torch.tensor([g], device=device)).logits[:, -1] for g in group]).float()
        gap = [x.topk(2, dim=-1).values for x in (together, alone)]
        worst_logit = max(worst_logit, float((together - alone).abs().max()))
        worst_gap = max(worst_gap, float(((gap[0][:, 0] - gap[0][:, 1]) - (gap[1][:, 0] - gap[1][:, 1])).abs().max()))
    return worst_logit, worst_gap


if __name__ == "__main__":
    main()
