"""Scoring throughput of a ~100M-parameter GPT-NeoX model through privbench's real scoring path.

Builds a GPT-NeoX causal LM in Hugging Face format from a config (random
weights: throughput does not depend on them), wraps it in
``bench.lm.HFLanguageModel`` and scores random texts with ``token_signals``:
tokenisation, length-sorted batching, automatic batch sizing (CUDA OOM → halve
and retry), the forward pass and the per-position statistics every attack uses
(log p of each token, mean and variance of log p under the model, top-1).

Reports tokens/s and model FLOPs utilisation (MFU), beside the floor scoring is measured against on the CPU
(``scripts/benchmark.py``'s ``bare_forward``: the same length-sorted batches, the forward pass, log-softmax and
the gather of the targets' log p, nothing else), so what the model's forward pass costs and what the signals
add are told apart. FLOPs per scored token are
the *forward* count 2N + 2·L·T·d (Kaplan et al. 2020, Table 1): N is the
parameter count without the input embedding (a lookup, not a matmul), the
second term is attention's QKᵀ and AV over the context T. Scoring is inference
only, so 6N (forward + backward, the training figure) does not apply. The
softmax statistics over the vocabulary are not counted, so MFU is a lower bound.

    python scripts/gpu_benchmark.py                       # ~100M model, on CUDA if present
    python scripts/gpu_benchmark.py --bf16                # bf16 autocast (GPUs with native bf16)
    PRIVBENCH_COMPILE=1 python scripts/gpu_benchmark.py --bf16 --compile-model   # compiled statistics and model
    python scripts/gpu_benchmark.py --preset tiny --n-texts 64 --seq-len 128   # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from bench.device import bf16_supported, release_memory, select_device, set_threads
from bench.lm import HFLanguageModel
from bench.logit_stats import compile_enabled
from benchmark import bare_forward  # scripts/benchmark.py: the CPU benchmark's floor, the same function

PRESETS = {  # hidden, layers, heads, vocab (untied input/output embeddings, as privbench's scratch models)
    "100m": dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=12, vocab_size=32_000),
    "pythia-160m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, vocab_size=50_304),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=4_000),
}
#: dense peak TFLOP/s by GPU name fragment: (bf16, fp32 via TF32 tensor cores); vendor data sheets (SXM parts)
PEAK_TFLOPS = {"H200": (989.0, 494.0), "H100": (989.0, 494.0), "A100": (312.0, 156.0), "L4": (121.0, 60.0),
               "A10": (125.0, 62.5)}


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer whose tokens are ``w0 … w{V-3}`` plus BOS and PAD: exact token counts."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<bos>": 0, "<pad>": 1, **{f"w{i}": i + 2 for i in range(vocab_size - 2)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<bos>", pad_token="<pad>")


def build_model(preset: str, seq_len: int, device: torch.device):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(**PRESETS[preset], intermediate_size=4 * PRESETS[preset]["hidden_size"],
                        max_position_embeddings=seq_len, rotary_pct=0.25, use_parallel_residual=True,
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(cfg).to(device).eval(), cfg


def flops_per_token(model, cfg, seq_len: int) -> tuple[float, int, int]:
    """(forward FLOPs per token, N without the input embedding, all parameters)."""
    n_all = sum(p.numel() for p in model.parameters())
    n = n_all - model.get_input_embeddings().weight.numel()
    return 2.0 * n + 2.0 * cfg.num_hidden_layers * seq_len * cfg.hidden_size, n, n_all


def peak_tflops(device: torch.device, bf16: bool, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for frag, (b, f) in PEAK_TFLOPS.items():
        if frag in name:
            return b if bf16 else f
    return None


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def write_profile(path: str, lm: HFLanguageModel, texts: list[str], result: dict) -> None:
    """Kernel tables of one batch of scoring and one of the bare forward: where the time the MFU leaves goes
    (the vocabulary-wide passes, the attention kernel, launches) is read here, not guessed."""
    from torch.profiler import ProfilerActivity, profile
    cuda = lm.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    sections = [f"# {json.dumps({k: result[k] for k in ('device', 'preset', 'bf16', 'batch_size_used')})}"]
    for name, run in (("scoring", lambda: lm._compute_signals([str(i) for i in range(len(texts))], texts)),
                      ("bare_forward", lambda: bare_forward(lm, texts))):
        run()  # warm: the profile shows the steady state, not first-call allocation
        with profile(activities=activities) as prof:
            run()
            if cuda:
                torch.cuda.synchronize(lm.device)
        sections.append(f"## {name}: one batch of {len(texts)} texts\n"
                        + prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60))
    with open(path, "w") as fh:
        fh.write("\n\n".join(sections) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="100m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--n-texts", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=256, help="starting batch; halved on CUDA OOM until it fits")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (ignored where bf16 is not native)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: known GPUs)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compile-model", action="store_true",
                    help="torch.compile the model (dynamic shapes) before scoring: how far a compiled forward lifts "
                         "MFU, which the eager Hugging Face forward caps (docs/benchmarks.md); privbench's own "
                         "scoring path does not compile the model")
    ap.add_argument("--profile", metavar="PATH", default=None,
                    help="after timing, profile one batch of scoring and one of the bare forward with "
                         "torch.profiler and write each one's kernel table (top 25 by device time) to PATH")
    args = ap.parse_args()
    set_threads()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores, as the peak assumes
    device = select_device(args.device)
    bf16 = args.bf16 and bf16_supported(device)
    model, cfg = build_model(args.preset, args.seq_len, device)
    fpt, n_matmul, n_params = flops_per_token(model, cfg, args.seq_len)
    if args.compile_model:
        model = torch.compile(model, dynamic=True)
    tok = word_tokenizer(cfg.vocab_size)
    rng = random.Random(0)
    n_words = args.seq_len - 1  # + BOS = seq_len tokens per text
    texts = [" ".join(f"w{rng.randrange(cfg.vocab_size - 2)}" for _ in range(n_words)) for _ in range(args.n_texts)]
    lm = HFLanguageModel(model, tok, fingerprint=f"bench-{args.preset}", max_length=args.seq_len,
                         batch_size=args.batch_size, device=device, autocast_bf16=bf16)
    lm._compute_signals(["warm0", "warm1"], texts[:2])  # warm-up: kernels, allocator
    best = None
    for _ in range(args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = lm._compute_signals([str(i) for i in range(len(texts))], texts)  # uncached: every call scores
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    n_tok = sum(s.n_tokens + 1 for s in out.values())  # + the BOS position, which the forward pass also computes
    tps = n_tok / best
    bare_best = None
    for _ in range(args.repeats):  # the floor, on the batch size scoring settled on
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        n_bare = bare_forward(lm, texts)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        bare_best = dt if bare_best is None else min(bare_best, dt)
    assert n_bare == n_tok, (n_bare, n_tok)
    tok_best = min(_timed(lm.encode_many, texts) for _ in range(args.repeats))  # inside both timings above
    bare_tps = n_tok / bare_best
    peak = peak_tflops(device, bf16, args.peak_tflops)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} "
                                                                                     f"threads)",
        "preset": args.preset, "params": n_params, "params_no_input_embedding": n_matmul,
        "seq_len": args.seq_len, "texts": len(texts), "batch_size_used": lm.batch_size, "bf16": bf16,
        "seconds": round(best, 3), "tokens_per_s": round(tps, 1),
        "flops_per_token": f"forward 2N + 2·L·T·d = {fpt:.4g}", "achieved_tflops": round(tps * fpt / 1e12, 3),
        "peak_tflops": peak, "mfu": None if peak is None else round(tps * fpt / (peak * 1e12), 4),
        "bare_forward_seconds": round(bare_best, 3), "bare_forward_tokens_per_s": round(bare_tps, 1),
        "bare_forward_mfu": None if peak is None else round(bare_tps * fpt / (peak * 1e12), 4),
        "score_vs_bare": round(tps / bare_tps, 3),
        "tokenize_seconds": round(tok_best, 3),  # host work inside both timings, on the CPU, before any batch runs
        "mfu_excluding_tokenization": (None if peak is None
                                       else round(n_tok / (best - tok_best) * fpt / (peak * 1e12), 4)),
        "compiled_stats": compile_enabled(), "compiled_model": args.compile_model,
    }
    if args.profile:
        write_profile(args.profile, lm, texts[:lm.batch_size], result)
    if device.type == "cuda":
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
    del lm, model
    release_memory(device)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
