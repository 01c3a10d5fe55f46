"""A GGUF checkpoint (SmolLM2-135M of the realistic track) is dequantised once into the artifact cache, keyed by
the file's content; every later load reads plain fp32 weights equal to what transformers' own GGUF load gives
(privbench parses the file once per load, bench.modeling.gguf_read_once)."""

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


def test_gguf_is_dequantised_once_and_loads_as_the_same_model(spec, tmp_path, capsys):
    import gguf
    readers = (gguf.GGUFReader, gguf.get_tensor_name_map)
    cache = ArtifactCache(tmp_path / "cache")
    key = pretrained_key(spec, None, None, [], 0)
    assert key == pretrained_key(spec, None, None, [], 1)  # a released θ: one per model, not per seed
    t0 = time.perf_counter()
    path, k = ensure_pretrained(cache, spec, None, (None, None), [], 0, torch.device("cpu"), progress=False)
    cold = time.perf_counter() - t0
    assert "de-quantizing" not in capsys.readouterr().err  # quiet: not even the loader's own bar
    assert k == key and cache.is_valid("pretrained", key) and str(path) != str(spec.hf_id)
    t0 = time.perf_counter()
    again, _ = ensure_pretrained(cache, spec, None, (None, None), [], 1, torch.device("cpu"))
    assert again == path and time.perf_counter() - t0 < cold  # found, not dequantised again
    import gguf
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == readers  # the read-once load put the library back
    cached, tok = load_model(path)
    # the library's own load, each GGUF parse and name map built as transformers does: the reference
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok0 = AutoTokenizer.from_pretrained(spec.hf_id, gguf_file=spec.gguf_file)
    original = AutoModelForCausalLM.from_pretrained(spec.hf_id, gguf_file=spec.gguf_file, dtype=torch.float32)
    ids = torch.tensor([tok0("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    assert tok("The quick brown fox jumps over the lazy dog.")["input_ids"] == ids[0].tolist()
    assert tok.get_vocab() == tok0.get_vocab()
    want, got = original.state_dict(), cached.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    with torch.no_grad():
        assert torch.equal(cached(input_ids=ids).logits, original(input_ids=ids).logits)
    assert len(gguf_fingerprint(spec)) == 64
