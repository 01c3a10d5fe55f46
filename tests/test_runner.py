"""The runner on a tiny world (seconds): failure handling, resume, and the Hugging Face model path."""

from __future__ import annotations

import numpy as np
import pytest

from bench.attack import Attack
from bench.cache import ArtifactCache
from bench.errors import PluginError
from bench.registry import ATTACKS
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite

from worlds import TINY  # noqa: E402  (the shared tiny world)


class _Bad(Attack):
    version = "0.0"

    def __init__(self, mode: str = "nan") -> None:
        super().__init__()
        self.mode = mode

    def score(self, view):
        n = len(view.targets)
        if self.mode == "nan":
            return np.full(n, np.nan)
        if self.mode == "short":
            return np.zeros(n - 1)
        raise RuntimeError("boom")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ArtifactCache(tmp_path_factory.mktemp("cache"))


def _suite(**over):
    raw = dict(TINY)
    raw.update(over)
    return parse_suite(raw)


def test_tiny_run_completes_and_resumes(cache, tmp_path):
    store = Store(str(tmp_path / "r.db"))
    result = Runner(_suite(), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 4
    rows = store.metric_rows(result.run_id)
    assert {(r["game"], r["attack"]) for r in rows} == {(g, a) for g in ("adapt", "null") for a in ("loss", "min_k")}
    # every evaluation carries its ROC ε lower bound at the suite's δ and confidence, flagged indicative
    eps = [r for r in rows if r["metric"] == "eps_lb_roc@95%,delta=1e-05"]
    assert len(eps) == 4 and all(r["value"] >= 0.0 and "indicative" in r["flag"] for r in eps)
    # a run that died (recorded as failed) resumes and skips stored evaluations
    store.finish_run(result.run_id, status="failed", error="killed")
    again = Runner(_suite(), store, cache, quiet=True).run()
    assert again.run_id == result.run_id and again.new_evaluations == 0 and again.skipped_evaluations == 4
    assert store.count_rows()["evaluations"] == 4


@pytest.mark.parametrize("mode,needle", [("nan", "NaN"), ("short", "scores for"), ("raise", "RuntimeError: boom")])
def test_bad_attack_fails_the_run_and_is_recorded(cache, tmp_path, monkeypatch, mode, needle):
    name = f"bad_{mode}"
    cls = type(f"Bad{mode}", (_Bad,), {"__init__": lambda self, **kw: _Bad.__init__(self, mode)})
    monkeypatch.setitem(ATTACKS._classes, name, cls)
    cls.name = name
    store = Store(str(tmp_path / "r.db"))
    suite = _suite(attacks=["loss", name])
    with pytest.raises(PluginError) as err:
        Runner(suite, store, cache, quiet=True).run()
    assert needle in str(err.value) and name in str(err.value)
    (run,) = store.list_runs()
    assert run["status"] == "failed"
    info = store.run_info(run["id"])
    assert needle in info["error"]
    # nothing of the bad attack was stored; the loss evaluation before it is kept for the resume
    rows = store.metric_rows(run["id"])
    assert {r["attack"] for r in rows} <= {"loss"}


def test_hugging_face_directory_model_runs_adaptation_games(cache, tmp_path):
    """A released checkpoint in HF format goes through the same loader a hub id would."""
    from transformers import AutoTokenizer

    from bench.artifacts import ensure_tokenizer
    from bench.modeling import ModelSpec, build_scratch_model
    from bench.registry import TASKS

    data = TASKS.create("mini_pile", {"max_chars_per_source": 400_000}).build(cache)
    tok_dir, _ = ensure_tokenizer(cache, ModelSpec("nano"), data)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = build_scratch_model(ModelSpec("x", num_layers=2, hidden_size=64, num_heads=4, context_length=64), tok, 0)
    release = tmp_path / "released-model"
    model.save_pretrained(release)
    tok.save_pretrained(release)
    suite = _suite(models=[{"name": "released", "params": {"hf_id": str(release), "context_length": 64}}],
                   defenses=[{"name": "finetune", "params": {"epochs": 1, "chunk_length": 64}}], reference=False)
    store = Store(str(tmp_path / "r.db"))
    result = Runner(suite, store, cache, quiet=True).run()
    assert result.status == "complete"
    roles = {r["role"] for r in store.utility_rows(result.run_id)}
    assert roles == {"pretrained", "adapted"}


def test_a_defense_that_reports_no_training_time_is_timed_by_the_runner():
    from bench.artifacts import with_train_seconds
    from bench.defense import Adapted
    assert with_train_seconds(Adapted(None, {}), 2.5).report == {"train": {"seconds": 2.5}}
    assert with_train_seconds(Adapted(None, {"train": {"seconds": 9.0, "steps": 3}}), 2.5).report == {
        "train": {"seconds": 9.0, "steps": 3}}  # its own figure stands
    assert with_train_seconds(Adapted(None, {"train": 7}), 1.0).report == {"train": {"value": 7, "seconds": 1.0}}


def test_hardware_records_the_cpu_model_and_the_kernels_torch_dispatches_to():
    """Two CPUs with one generic name sum floats differently (docs/determinism.md): the run says which it was."""
    import os
    import re

    import torch

    from bench.runner import hardware_info

    info = hardware_info()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cpu"]
    if os.path.exists("/proc/cpuinfo"):
        text = open("/proc/cpuinfo", encoding="utf-8").read()
        model = re.search(r"^model\s*:\s*(\S+)", text, re.M)
        if model:  # x86 Linux: the model number tells CPU generations apart
            assert f"model {model.group(1)}" in info["cpu"]
