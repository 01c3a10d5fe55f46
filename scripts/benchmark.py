"""Throughput and wall-time benchmark of privbench on this machine.

Prints training and scoring throughput (tokens/s) of the embedded model family
on real corpus records, and the cold-cache wall time of the smoke and quick
suites. Not a test: run it on an otherwise idle machine and record its output
in docs/benchmarks.md.

    python scripts/benchmark.py                 # throughput + smoke + quick
    python scripts/benchmark.py --skip-suites   # throughput only (~1 min)
    python scripts/benchmark.py --compare-executors --suites smoke   # local vs ray, cold cache each
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.allocator import tune_allocator
from bench.cache import ArtifactCache
from bench.defense import TrainContext
from bench.device import set_threads
from bench.lm import HFLanguageModel, right_padded
from bench.logit_stats import compile_enabled
from bench.modeling import BUILTIN_SPECS, build_scratch_model
from bench.artifacts import ensure_tokenizer
from bench.registry import TASKS
from bench.training import train_causal_lm


def throughput(spec_name: str, data, tok, n_texts: int = 320, rounds: int = 3) -> dict:
    spec = BUILTIN_SPECS[spec_name]
    texts = list(data.targets[i].text for i in range(n_texts))
    model = build_scratch_model(spec, tok, seed=0)
    ctx = TrainContext(tok, torch.device("cpu"), spec.context_length, 0, spec.autocast_bf16, progress=False)
    seqs = ctx.encode(texts)
    train_causal_lm(model, seqs[:32], epochs=1, lr=1e-4, batch_size=16, seed=0, pad_id=ctx.pad_id,
                    autocast_bf16=spec.autocast_bf16, progress=False)  # warm-up
    stats = train_causal_lm(model, seqs, epochs=1, lr=1e-4, batch_size=spec.pretrain_batch_size, seed=0,
                            pad_id=ctx.pad_id, autocast_bf16=spec.autocast_bf16, progress=False)
    lm = HFLanguageModel(model, tok, fingerprint=f"bench-{spec_name}-{time.time()}", max_length=spec.context_length,
                         batch_size=spec.score_batch_size)
    lm.token_signals(texts[:16])
    bare_forward(lm, texts[:16])
    score, bare, n_tok = [], [], 0
    for r in range(rounds):  # interleaved, fresh handles (no cached signals); process time, median of rounds
        lm2 = HFLanguageModel(model, tok, fingerprint=f"bench2-{spec_name}-{r}-{time.time()}",
                              max_length=spec.context_length, batch_size=spec.score_batch_size)
        t0 = time.process_time()
        sig = lm2.token_signals(texts)
        score.append(time.process_time() - t0)
        n_tok = sum(s.n_tokens + 1 for s in sig)
        t0 = time.process_time()
        n_bare = bare_forward(lm2, texts)
        bare.append(time.process_time() - t0)
        assert n_bare == n_tok, (n_bare, n_tok)
    params = sum(p.numel() for p in model.parameters())
    s_tps, b_tps = n_tok / statistics.median(score), n_tok / statistics.median(bare)
    return {"model": spec_name, "params_M": round(params / 1e6, 2),
            "train_tokens_per_s": round(stats.tokens_per_s), "train_precision": "bf16 autocast"
            if spec.autocast_bf16 else "fp32",
            "score_tokens_per_s": round(s_tps), "bare_forward_tokens_per_s": round(b_tps),
            "score_vs_bare": round(s_tps / b_tps, 3), "score_compiled": compile_enabled(),
            "score_timing": f"process time, median of {rounds} interleaved rounds",
            "score_precision": "fp32 (signals incl. mean/var of log p)"}


@torch.no_grad()
def bare_forward(lm: HFLanguageModel, texts: list[str]) -> int:
    """The floor scoring is measured against: the same length-sorted batches as ``lm.token_signals``, a
    forward pass, log-softmax and the gather of the targets' log p, nothing else. Returns the tokens."""
    encoded = lm.encode_many(texts)
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    model = lm._model
    for i in range(0, len(order), lm.batch_size):
        ids, mask = right_padded([encoded[j] for j in order[i:i + lm.batch_size]], pad, lm.device)
        with lm._autocast():  # the scoring handle's precision (bf16 autocast where it scores in bf16)
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1))
        lp.cpu()
    return sum(len(e) for e in encoded)


def suite_wall_time(suite: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PRIVBENCH_CACHE=str(Path(tmp) / "cache"))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bench", "run", "--suite", suite, "--db", str(Path(tmp) / "r.db"),
                        "--quiet", "--no-report"], env=env, check=True)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bench", "run", "--suite", suite, "--db", str(Path(tmp) / "r2.db"),
                        "--quiet", "--no-report"], env=env, check=True)
        warm = time.perf_counter() - t0
    return {"suite": suite, "cold_cache_s": round(cold, 1), "warm_cache_new_db_s": round(warm, 1)}


def executor_wall_time(suite: str, executor: str, threads_per_ray_job: int = 1) -> dict:
    """Cold-cache wall time of ``privbench run`` with one executor (its own empty cache and database).
    Ray jobs get ``threads_per_ray_job`` torch threads each, so parallel jobs do not oversubscribe the cores."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PRIVBENCH_CACHE=str(Path(tmp) / "cache"))
        if executor == "ray":
            env["PRIVBENCH_THREADS"] = str(threads_per_ray_job)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bench", "run", "--suite", suite, "--db", str(Path(tmp) / "r.db"),
                        "--quiet", "--no-report", "--executor", executor], env=env, check=True)
        return {"suite": suite, "executor": executor, "cold_cache_s": round(time.perf_counter() - t0, 1),
                "threads": env.get("PRIVBENCH_THREADS", "all")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-suites", action="store_true")
    ap.add_argument("--suites", nargs="*", default=["smoke", "quick"])
    ap.add_argument("--compare-executors", action="store_true",
                    help="only: cold-cache wall time of each suite with --executor local and --executor ray")
    args = ap.parse_args()
    if args.compare_executors:
        for s in args.suites:
            for ex in ("local", "ray"):
                print(json.dumps(executor_wall_time(s, ex)), flush=True)
        return
    set_threads()
    tune_allocator()
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))
    with tempfile.TemporaryDirectory() as tmp:
        cache = ArtifactCache(Path(tmp))
        data = TASKS.create("mini_pile", {"max_chars_per_source": 1_500_000}).build(cache)
        from transformers import AutoTokenizer
        tok_dir, _ = ensure_tokenizer(cache, BUILTIN_SPECS["nano"], data)
        tok = AutoTokenizer.from_pretrained(tok_dir)
        for name in ("nano", "micro"):
            print(json.dumps(throughput(name, data, tok)), flush=True)
    if not args.skip_suites:
        for s in args.suites:
            print(json.dumps(suite_wall_time(s)), flush=True)


if __name__ == "__main__":
    main()
