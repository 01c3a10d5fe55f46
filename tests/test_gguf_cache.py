"""A GGUF checkpoint (SmolLM2-135M of the realistic track) is dequantised once into the artifact cache, keyed by
the file's content; every later load reads plain fp32 weights that give exactly the GGUF model's logits."""

from __future__ import annotations

import time

import pytest
import torch

from bench.artifacts import ensure_pretrained, gguf_fingerprint, pretrained_key
from bench.cache import ArtifactCache
from bench.modeling import load_model, resolve_spec

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def spec():
    from bench.errors import ConfigError
    try:
        return resolve_spec("smollm2-135m", {})
    except ConfigError as exc:
        pytest.skip(str(exc))


def test_gguf_is_dequantised_once_and_loads_as_the_same_model(spec, tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    key = pretrained_key(spec, None, None, [], 0)
    assert key == pretrained_key(spec, None, None, [], 1)  # a released θ: one per model, not per seed
    t0 = time.perf_counter()
    path, k = ensure_pretrained(cache, spec, None, (None, None), [], 0, torch.device("cpu"))
    cold = time.perf_counter() - t0
    assert k == key and cache.is_valid("pretrained", key) and str(path) != str(spec.hf_id)
    t0 = time.perf_counter()
    again, _ = ensure_pretrained(cache, spec, None, (None, None), [], 1, torch.device("cpu"))
    assert again == path and time.perf_counter() - t0 < cold  # found, not dequantised again
    cached, tok = load_model(path)
    original, tok0 = load_model(spec.hf_id, gguf_file=spec.gguf_file)
    ids = torch.tensor([tok0("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    assert tok("The quick brown fox jumps over the lazy dog.")["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(cached(input_ids=ids).logits, original(input_ids=ids).logits)
    assert len(gguf_fingerprint(spec)) == 64
