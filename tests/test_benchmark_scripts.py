"""scripts/gpu_benchmark.py, the GPU measurement of docs/benchmarks.md, run as a CPU dry run: it scores, times the
bare forward on the same batches, and counts FLOPs as its docstring says (2N + 2·L·T·d, N without the input
embedding), checked against a count made here from the model's own layers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_benchmark.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports its sibling scripts/benchmark.py
    try:
        spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_flops_per_token_counts_the_forward_matmuls():
    mod = _module()
    model, cfg = mod.build_model("tiny", 64, torch.device("cpu"))
    fpt, n, n_all = mod.flops_per_token(model, cfg, 64)
    emb = model.get_input_embeddings().weight.numel()
    assert n_all == sum(p.numel() for p in model.parameters()) and n == n_all - emb
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linear <= n < linear + 0.05 * n  # N is the matmul weights, plus biases and norms (a few percent)
    assert fpt == 2 * n + 2 * cfg.num_hidden_layers * 64 * cfg.hidden_size


def test_dry_run_reports_scoring_beside_the_bare_forward(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PRIVBENCH_COMPILE"}
    env.update(PRIVBENCH_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny", "--n-texts", "12", "--seq-len", "32",
                           "--device", "cpu", "--repeats", "1", "--profile", str(tmp_path / "profile.txt")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["texts"] == 12 and out["seq_len"] == 32 and out["mfu"] is None  # no peak known for a CPU
    assert out["tokens_per_s"] > 0 and out["bare_forward_tokens_per_s"] > 0
    assert abs(out["score_vs_bare"] - out["tokens_per_s"] / out["bare_forward_tokens_per_s"]) < 0.01
    assert out["compiled_model"] is False and out["compiled_stats"] is False
    assert 0 < out["tokenize_seconds"] < out["seconds"] and out["mfu_excluding_tokenization"] is None
    tables = (tmp_path / "profile.txt").read_text()
    assert "## scoring" in tables and "## bare_forward" in tables and "aten::" in tables


REVISIONS = REPO / "scripts" / "dp_step_revisions.py"


def _revisions(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRIVBENCH_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REVISIONS), *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_dp_step_revisions_tells_a_rounding_change_from_an_identical_step(tmp_path):
    """scripts/dp_step_revisions.py --check-identical is what docs/benchmarks.md cites for "bit-identical": a copy
    of the checkout's book-keeping module whose clipping coefficient rounds differently (ε 1e-6 → 1e-7 in
    C / (‖g‖ + ε)) must be reported as different, with a non-zero exit, and a plain copy as identical."""
    source = (REPO / "defenses" / "dp_bookkeeping.py").read_text()
    assert "(norm2.sqrt() + 1e-6)" in source
    changed = tmp_path / "changed.py"
    changed.write_text(source.replace("(norm2.sqrt() + 1e-6)", "(norm2.sqrt() + 1e-7)"))
    proc = _revisions(str(changed), "--check-identical", "--methods", "lora")
    assert proc.returncode == 1, proc.stderr
    assert "DIFFERENT" in proc.stdout and "the revisions differ" in proc.stdout
    same = tmp_path / "same.py"
    same.write_text(source)
    proc = _revisions(str(same), "--check-identical", "--methods", "lora")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines if ln.endswith("bit-identical")] == ["lora"] * 4 + ["every"]


def test_dp_step_revisions_times_and_counts_both_revisions_and_refuses_a_missing_file(tmp_path):
    same = tmp_path / "same.py"
    same.write_text((REPO / "defenses" / "dp_bookkeeping.py").read_text())
    out = tmp_path / "rows.json"
    proc = _revisions(str(same), "--specs", "nano", "--methods", "lora", "--batches", "2", "--length", "16",
                      "--steps", "3", "--rounds", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and rows[0]["spec"] == "nano" and rows[0]["method"] == "lora" and rows[0]["batch"] == 2
    assert len(rows[0]["other"]) == len(rows[0]["this"]) == 1 and rows[0]["nonprivate_s"] > 0
    assert proc.stdout.splitlines()[-1].split()[:3] == ["nano", "lora", "2"]
    proc = _revisions(str(same), "--count-ops", "--specs", "nano", "--methods", "head", "--length", "16")
    assert proc.returncode == 0, proc.stderr
    spec, method, base, theirs, _, ours, _, grouped, _ = proc.stdout.splitlines()[-1].split()
    assert (spec, method) == ("nano", "head") and int(base) > 100 and theirs == ours  # one code, one count
    assert int(grouped) <= int(ours)  # the head is one layer: nothing to group, no more operations
    proc = _revisions(str(tmp_path / "absent.py"))
    assert proc.returncode == 2 and "git show REV:defenses/dp_bookkeeping.py" in proc.stderr
