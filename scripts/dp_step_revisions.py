"""Book-keeping DP-SGD step cost of this checkout against another revision's, in one process.

Machines of one kind differ by several per cent between calls (docs/benchmarks.md, "Second pass on the H200"),
so a speed change of the book-keeping step is timed before and after in the same process: the other revision's
``defenses/dp_bookkeeping.py`` is loaded in place of this checkout's for every other measurement, alternating,
with ``defenses.dp.measure_step_cost`` (non-private step and bk step of the same random-init model).

    git show REV:defenses/dp_bookkeeping.py > /tmp/bk_old.py
    python scripts/dp_step_revisions.py /tmp/bk_old.py [--specs nano,micro] [--methods full,lora,head]
                                        [--batches 16,64] [--rounds 2] [--json PATH]
    python scripts/dp_step_revisions.py /tmp/bk_old.py --check-identical
    python scripts/dp_step_revisions.py /tmp/bk_old.py --count-ops [--specs nano] [--methods full,lora,head]

``--check-identical`` instead trains a small model four noisy DP-SGD steps with each revision (each of ``--methods``;
record and unit level; the ghost-norm and the formed-gradient paths) and says whether every parameter and loss is
bit for bit the same: a speed change that keeps it so moves no stored result.

``--count-ops`` counts, on the CPU, the top-level operations one optimizer step dispatches (torch.profiler; AdamW
with ``foreach``, as on a GPU), non-private and book-keeping with each revision, and this checkout's step with
its layers grouped (what ``bk`` runs on CUDA): on a GPU where a small model's step is bound by kernel launches,
the ratio of these counts is what a change of the step's host side can move.

Prints one line per (spec, method, batch): the median over rounds of each revision's DP/non-DP ratio (wall time
on CUDA, process time on CPU, as ``python -m defenses.dp``, and like it on ``PRIVBENCH_THREADS`` torch threads,
default 1). Each revision runs its ``bk`` as that device's default: this checkout groups layers on CUDA only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import defenses.dp_bookkeeping as current  # noqa: E402
from defenses.dp import measure_step_cost, record_losses, step_cost_config, step_cost_model  # noqa: E402


def load_revision(path: Path):
    """The other revision's module, under its own name (it imports only modules this checkout has)."""
    spec = importlib.util.spec_from_file_location("dp_bookkeeping_other", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ratio(module, spec: str, method: str, batch: int, length: int, steps: int) -> tuple[float, float]:
    """(non-private seconds, DP/non-DP ratio) of the bk step with ``module`` standing in for dp_bookkeeping."""
    sys.modules["defenses.dp_bookkeeping"] = module  # _own_dp_step imports BookKeepingDP from here at each call
    try:
        r = measure_step_cost(spec, method=method, batch=batch, length=length, steps=steps, modes=("bk",))
    finally:
        sys.modules["defenses.dp_bookkeeping"] = current
    key = "wall" if r["device"] != "cpu" else "cpu"
    if "bk_error" in r:
        raise SystemExit(f"error: bk step failed for {spec} {method}: {r['bk_error']}")
    return r[f"nonprivate_{key}_s"], r[f"bk_ratio_{key}"]


def identical(other, methods: tuple[str, ...] = ("full", "lora", "head")) -> bool:
    """Both revisions' book-keeping steps from the same model, batches and noise generator: True when every
    parameter and every step's loss is bit for bit the same, for each method, level and norm path."""
    from transformers import GPTNeoXConfig

    cfg = GPTNeoXConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=64, rotary_pct=0.25,
                        use_parallel_residual=True, tie_word_embeddings=False)

    def train(module, method: str, units: list[int] | None, length: int):
        model = step_cost_model(cfg, method)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        dp = module.BookKeepingDP(model, opt, noise_multiplier=0.7, max_grad_norm=0.5, expected_batch_size=8,
                                  generator=torch.Generator().manual_seed(3), loss_fn=record_losses)
        data = torch.Generator().manual_seed(1)
        row_unit = None if units is None else torch.tensor([u for u, k in enumerate(units) for _ in range(k)])
        losses = []
        for _ in range(4):
            ids = torch.randint(0, 512, (8, length), generator=data)
            mask = torch.ones_like(ids)
            mask[0, length // 2:] = 0
            losses.append(dp.backward(ids, mask) if row_unit is None else dp.backward(ids, mask, row_unit))
            dp.step()
            dp.zero_grad()
        return [p.detach().clone() for p in model.parameters()], torch.stack(losses)

    every = True
    for method in methods:
        for units in (None, [1, 3, 2, 1, 1]):
            for length in (8, 48):  # 8 tokens: ghost norms; 48: formed per-record gradients (hidden size 64)
                (p_a, l_a), (p_b, l_b) = train(other, method, units, length), train(current, method, units, length)
                same = torch.equal(l_a, l_b) and all(torch.equal(a, b) for a, b in zip(p_a, p_b))
                every &= same
                print(f"{method:<5} {'units' if units else 'records':<8} T={length:<3} "
                      f"{'bit-identical' if same else 'DIFFERENT'}", flush=True)
    return every


def count_ops(module, spec_name: str, method: str, length: int = 128, **bk_kw) -> tuple[int, int]:
    """(non-private, book-keeping) top-level aten operations of one optimizer step on 2 records of ``length``
    tokens, with ``module`` as the book-keeping implementation (``bk_kw`` to its constructor); the model as
    ``measure_step_cost`` builds it."""
    from torch.profiler import ProfilerActivity, profile

    cfg = step_cost_config(spec_name)
    ids = torch.randint(0, cfg.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    plain = step_cost_model(cfg, method)
    opt = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    private = step_cost_model(cfg, method)
    dp = module.BookKeepingDP(private, torch.optim.AdamW([p for p in private.parameters() if p.requires_grad],
                                                         lr=1e-4, foreach=True),
                              noise_multiplier=1.0, max_grad_norm=0.1, expected_batch_size=2, generator=None,
                              loss_fn=record_losses, **bk_kw)

    def nonprivate_step() -> None:
        record_losses(plain(input_ids=ids, attention_mask=mask).logits, ids, mask).mean().backward()
        opt.step()
        opt.zero_grad()

    def bk_step() -> None:
        dp.backward(ids, mask)
        dp.step()
        dp.zero_grad()

    def top_level(step) -> int:
        step()  # the optimizer's state exists from the second step on
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        return sum(1 for e in prof.events() if e.name.startswith("aten::")
                   and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))

    return top_level(nonprivate_step), top_level(bk_step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other", type=Path, help="another revision's defenses/dp_bookkeeping.py")
    ap.add_argument("--specs", default="nano,micro")
    ap.add_argument("--methods", default="full,lora,head")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two revisions (median reported)")
    ap.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    ap.add_argument("--count-ops", action="store_true",
                    help="count the operations one step dispatches (CPU) instead of timing steps")
    ap.add_argument("--check-identical", action="store_true",
                    help="check that both revisions train bit-identical models instead of timing them")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("PRIVBENCH_THREADS", "1") or 1))
    if not args.other.is_file():
        ap.error(f"{args.other} is not a file: write one with git show REV:defenses/dp_bookkeeping.py > FILE")
    other = load_revision(args.other)
    if args.check_identical:
        ok = identical(other, tuple(args.methods.split(",")))
        print("every step bit-identical" if ok else "the revisions differ")
        return 0 if ok else 1
    if args.count_ops:
        print(f"{'spec':<7}{'method':<7}{'nonprivate ops':>16}{'other bk':>18}{'this bk':>18}"
              f"{'this, grouped':>18}")
        for spec in args.specs.split(","):
            for method in args.methods.split(","):
                base, theirs = count_ops(other, spec, method, args.length)
                _, ours = count_ops(current, spec, method, args.length, group_layers=False)
                _, grouped = count_ops(current, spec, method, args.length, group_layers=True)
                print(f"{spec:<7}{method:<7}{base:>16}" + "".join(f"{c:>11} ({c / base:.2f}x)" for c in
                                                                 (theirs, ours, grouped)), flush=True)
        return 0
    rows = []
    print(f"{'spec':<7}{'method':<7}{'batch':>6}{'nonprivate s':>14}{'other bk':>10}{'this bk':>10}")
    for spec in args.specs.split(","):
        for method in args.methods.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                seen: dict[str, list[float]] = {"other": [], "this": []}
                base: list[float] = []
                for _ in range(args.rounds):
                    for name, module in (("other", other), ("this", current)):
                        seconds, r = ratio(module, spec, method, batch, args.length, args.steps)
                        seen[name].append(r)
                        base.append(seconds)
                row = {"spec": spec, "method": method, "batch": batch, "length": args.length,
                       "nonprivate_s": statistics.median(base), "other": seen["other"], "this": seen["this"]}
                rows.append(row)
                print(f"{spec:<7}{method:<7}{batch:>6}{row['nonprivate_s']:>14.4f}"
                      f"{statistics.median(seen['other']):>9.2f}x{statistics.median(seen['this']):>9.2f}x", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
