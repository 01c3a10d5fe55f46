"""The artifact store (bench/artifact_store.py): what one cache builds another finds, and nothing it holds is
trusted unchecked: a tampered, truncated or path-escaping archive is a miss and the artifact is built locally."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bench.artifact_store import ArtifactStore
from bench.cache import MANIFEST, ArtifactCache
from bench.errors import ConfigError
from bench.lm import SignalCache
from bench.signals import TokenSignals


def _writer(text: str, calls: list):
    def build(tmp: Path) -> None:
        calls.append(text)
        (tmp / "weights.bin").write_bytes(text.encode() * 100)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "config.json").write_text(json.dumps({"text": text}))
    return build


def test_an_artifact_built_on_one_node_is_fetched_by_another_and_verified(tmp_path):
    store = ArtifactStore((tmp_path / "bucket").as_uri())
    calls: list = []
    a = ArtifactCache(tmp_path / "node-a", store=store)
    b = ArtifactCache(tmp_path / "node-b", store=ArtifactStore((tmp_path / "bucket").as_uri()))
    assert not b.is_valid("pretrained", "k1")
    path_a = a.get_or_build("pretrained", "k1", _writer("theta", calls))
    assert calls == ["theta"] and (tmp_path / "bucket" / "pretrained" / "k1.tar").is_file()
    assert b.is_valid("pretrained", "k1", verify=False)  # the plan sees it as done before any node downloads it
    path_b = b.get_or_build("pretrained", "k1", _writer("never built", calls))
    assert calls == ["theta"]  # fetched, not built
    assert path_b.parent.parent == tmp_path / "node-b"
    for rel in ("weights.bin", "sub/config.json", MANIFEST):
        assert (path_a / rel).read_bytes() == (path_b / rel).read_bytes()
    assert ArtifactCache(tmp_path / "node-b").verify_all() == {"valid": ["pretrained/k1"], "invalid": []}
    assert not list((tmp_path / "bucket").rglob(".*"))  # no temporary upload left behind


def test_an_artifact_already_in_a_local_cache_is_published_when_used(tmp_path):
    calls: list = []
    ArtifactCache(tmp_path / "node-a").get_or_build("tokenizer", "t1", _writer("tok", calls))  # no store yet
    store = ArtifactStore((tmp_path / "bucket").as_uri())
    ArtifactCache(tmp_path / "node-a", store=store).get_or_build("tokenizer", "t1", _writer("again", calls))
    assert calls == ["tok"] and store.has("tokenizer", "t1")


def _tampered_archive(store_dir: Path, kind: str, key: str, mutate) -> None:
    path = store_dir / kind / f"{key}.tar"
    with tarfile.open(path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    mutate(members)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("attack", ["flipped_weights", "truncated", "escaping_path", "other_key"])
def test_a_tampered_archive_is_a_miss_and_the_artifact_is_built_locally(tmp_path, attack):
    url = (tmp_path / "bucket").as_uri()
    calls: list = []
    ArtifactCache(tmp_path / "node-a", store=ArtifactStore(url)).get_or_build("adapted", "k", _writer("good", calls))
    bucket = tmp_path / "bucket"
    if attack == "flipped_weights":
        _tampered_archive(bucket, "adapted", "k", lambda m: m.update({"weights.bin": b"X" + m["weights.bin"][1:]}))
    elif attack == "truncated":
        p = bucket / "adapted" / "k.tar"
        p.write_bytes(p.read_bytes()[:700])
    elif attack == "escaping_path":
        def escape(m):
            m["../../escaped.txt"] = b"planted"
            manifest = json.loads(m[MANIFEST])
            manifest["files"]["../../escaped.txt"] = {"size": 7, "sha256": "0" * 64}
            m[MANIFEST] = json.dumps(manifest).encode()
        _tampered_archive(bucket, "adapted", "k", escape)
    else:  # a valid archive of another artifact under this key
        def rename(m):
            manifest = json.loads(m[MANIFEST])
            manifest["key"] = "another"
            m[MANIFEST] = json.dumps(manifest).encode()
        _tampered_archive(bucket, "adapted", "k", rename)
    b = ArtifactCache(tmp_path / "node-b", store=ArtifactStore(url))
    path = b.get_or_build("adapted", "k", _writer("rebuilt", calls))
    assert calls == ["good", "rebuilt"]
    assert (path / "sub" / "config.json").read_text() == json.dumps({"text": "rebuilt"})
    assert ArtifactCache(tmp_path / "node-b").verify_all()["invalid"] == []
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not [p for p in (tmp_path / "node-b" / "adapted").iterdir() if p.name.startswith(".") and p.is_dir()]


def test_signal_shards_travel_through_the_store(tmp_path):
    url = (tmp_path / "bucket").as_uri()
    a = SignalCache(tmp_path / "a" / "signals", store=ArtifactStore(url))
    sig = TokenSignals(token_ids=np.array([1, 2, 3], dtype=np.int32),
                       logprobs=np.array([-1.0, -2.0, -0.5], dtype=np.float32),
                       mu=np.array([-1.1, -1.2, -1.3], dtype=np.float32),
                       sigma2=np.array([0.1, 0.2, 0.3], dtype=np.float32), top1=np.array([1, 0, 1], dtype=np.int8))
    a.add("fp1", {"h1": sig})
    a.add_generations("fp1", {"g1": "continued"})
    b = SignalCache(tmp_path / "b" / "signals", store=ArtifactStore(url))
    got = b.lookup("fp1", ["h1", "missing"])
    assert list(got) == ["h1"] and np.array_equal(got["h1"].logprobs, sig.logprobs)
    assert b.lookup_generations("fp1", ["g1"]) == {"g1": "continued"}
    assert sorted(p.suffix for p in (tmp_path / "b" / "signals" / "fp1").iterdir()) == [".json", ".npz"]
    # a corrupt shard in the store is skipped and deleted locally, never trusted
    shard = next((tmp_path / "bucket" / "signals" / "fp1").glob("*.npz"))
    shard.write_bytes(b"not a zip")
    c = SignalCache(tmp_path / "c" / "signals", store=ArtifactStore(url))
    assert c.lookup("fp1", ["h1"]) == {}


def test_a_store_that_refuses_writes_is_a_one_line_error(tmp_path):
    ro = tmp_path / "read-only"
    ro.mkdir()
    os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(ro, os.W_OK):  # root ignores permissions: use a path under a file instead
            target = (tmp_path / "a-file").as_uri() + "/bucket"
            (tmp_path / "a-file").write_text("")
        else:
            target = ro.as_uri()
        with pytest.raises(ConfigError, match="refuses writes.*or drop --artifact-store"):
            ArtifactStore(target)
    finally:
        os.chmod(ro, stat.S_IRWXU)


def test_cli_refuses_an_unwritable_store_before_touching_the_database(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = subprocess.run([sys.executable, "-m", "bench", "run", "--suite", "smoke", "--db",
                          str(tmp_path / "x.db"), "--cache", str(tmp_path / "cache"),
                          "--artifact-store", (tmp_path / "a-file").as_uri() + "/bucket"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "refuses writes" in out.stderr
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "cache").exists()
