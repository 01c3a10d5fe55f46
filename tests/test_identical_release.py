"""A θ′ that is θ byte for byte (the `none` anchor) is scored as θ: its signals, generations and utility come from
θ's caches instead of a second forward pass over every text. The decision is made from the checksums of the
released files (the manifests the artifact cache writes), never from what a defense reports, so a defense that
adapts and claims it did not is scored on its own outputs (tests/plugins/claims_unchanged_defense.py); and the
stored rows are the ones a run without the shortcut stores, to the last bit."""

from __future__ import annotations

import sys
from pathlib import Path

import bench.world
from bench.cache import ArtifactCache, same_content
from bench.lm import HFLanguageModel
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite
from worlds import TINY


def _writer(files: dict[str, bytes]):
    def build(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return build


def test_same_content_compares_the_manifests(tmp_path):
    cache = ArtifactCache(tmp_path)
    theta = cache.get_or_build("pretrained", "t", _writer({"model.safetensors": b"w" * 64, "config.json": b"{}",
                                                           "privbench.json": b"{}"}))
    same = cache.get_or_build("adapted", "s", _writer({"model.safetensors": b"w" * 64, "config.json": b"{}",
                                                       "privbench.json": b'{"report": {"steps": 0}}'}))
    nudged = cache.get_or_build("adapted", "n", _writer({"model.safetensors": b"w" * 63 + b"x",
                                                         "config.json": b"{}"}))
    reconfigured = cache.get_or_build("adapted", "c", _writer({"model.safetensors": b"w" * 64,
                                                               "config.json": b'{"rope_theta": 1}'}))
    extra = cache.get_or_build("adapted", "e", _writer({"model.safetensors": b"w" * 64, "config.json": b"{}",
                                                        "adapter.safetensors": b"a"}))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes(b"w" * 64)
    assert same_content(theta, same) and same_content(same, theta)  # the training report is not content
    assert not same_content(theta, nudged)
    assert not same_content(theta, reconfigured)
    assert not same_content(theta, extra)
    assert not same_content(theta, bare)  # no manifest: never the same
    assert not same_content(theta, "HuggingFaceTB/SmolLM2-135M")  # a hub id, not a cached artifact


def test_identical_release_is_scored_as_theta_and_a_claim_is_not(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent / "plugins"))
    import claims_unchanged_defense  # noqa: F401  (registers claims_unchanged)

    raw = dict(TINY, defenses=["none", {"name": "claims_unchanged", "params": {"epochs": 2}}], attacks=["loss"])
    scored: list[str] = []  # the fingerprint of every model that ran a forward pass over texts
    compute = HFLanguageModel._compute_signals

    def spy(self, keys, texts, prefix=None):
        scored.append(self.fingerprint)
        return compute(self, keys, texts, prefix)

    monkeypatch.setattr(HFLanguageModel, "_compute_signals", spy)
    cache = ArtifactCache(tmp_path / "cache")
    store = Store(str(tmp_path / "a.db"))
    runner = Runner(parse_suite(raw), store, cache, quiet=True)
    first = runner.run()
    w, spec = runner.worlds, runner.suite.models[0]
    fp_theta = w.fingerprint(w.theta(0, 0, 0)[1], spec)
    (_, key_none, _), (_, key_claim, meta_claim) = w.adapted(0, 0, 0, 0), w.adapted(0, 0, 0, 1)
    fp_none, fp_claim = w.fingerprint(key_none, spec), w.fingerprint(key_claim, spec)
    assert meta_claim["report"]["train"]["steps"] == 0  # it says what `none` says ...
    assert w.model_lm(0, 0, 0, "adapted", 0).fingerprint == fp_theta
    assert w.model_lm(0, 0, 0, "adapted", 1).fingerprint == fp_claim != fp_theta  # ... and is scored as itself
    assert fp_theta in scored and fp_claim in scored and fp_none not in scored
    leak = {r["game"]: r["value"] for r in store.metric_rows(first.run_id)
            if r["defense"] == "claims_unchanged" and r["metric"] == "auc"}
    assert leak["adapt"] > 0.75  # its members are found: it did adapt

    # the same suite with the shortcut switched off, into a new database over the same cache: only θ′ of `none` is
    # scored again (under its own fingerprint), and every stored score and metric is the same to the last bit
    scored.clear()
    monkeypatch.setattr(bench.world, "same_content", lambda a, b: False)
    store2 = Store(str(tmp_path / "b.db"))
    second = Runner(parse_suite(raw), store2, cache, quiet=True).run()
    assert set(scored) == {fp_none}

    def rows(s, run_id):
        evs = {e["eval_key"]: s.scores_for(e["id"]) for e in s.evaluations(run_id)}
        metrics = [{k: v for k, v in r.items() if k != "run"} for r in s.metric_rows(run_id)]
        utility = sorted((u["defense"], u["role"], u["dataset"], u["metric"], u["value"], u["n_tokens"])
                         for u in s.utility_rows(run_id) if u["metric"] not in ("train_seconds", "adapt_seconds"))
        return evs, metrics, utility

    assert rows(store, first.run_id) == rows(store2, second.run_id)
