"""scripts/carry_parts.py: a file cut into parts comes back byte for byte, and only then; a missing, cut-short,
altered or foreign part is refused by name, with nothing written where the file would be."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "carry_parts.py"


def _module():
    spec = importlib.util.spec_from_file_location("carry_parts", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


carry = _module()


@pytest.fixture
def split_file(tmp_path):
    """A 2.5 MiB file split into 1 MiB parts, the parts then moved apart as two calls would leave them."""
    data = os.urandom((5 << 20) // 2)
    src = tmp_path / "model.whl"
    src.write_bytes(data)
    manifest = carry.split(src, tmp_path / "out", part_mib=1)
    first, second = tmp_path / "call1", tmp_path / "call2"
    first.mkdir(), second.mkdir()
    parts = json.loads(manifest.read_text())["parts"]
    for i, part in enumerate(parts):
        (tmp_path / "out" / part["file"]).rename((first if i % 2 == 0 else second) / part["file"])
    return {"data": data, "manifest": manifest, "dirs": [first, second], "parts": parts, "dest": tmp_path / "dest"}


def test_parts_join_back_into_the_same_bytes(split_file):
    parts = split_file["parts"]
    assert [p["bytes"] for p in parts] == [1 << 20, 1 << 20, 1 << 19]
    target = carry.join(split_file["manifest"], split_file["dest"], split_file["dirs"])
    assert target.name == "model.whl" and target.read_bytes() == split_file["data"]
    assert sorted(p.name for p in split_file["dest"].iterdir()) == ["model.whl"]  # no temporary left


def test_an_empty_file_and_one_smaller_than_a_part_round_trip(tmp_path):
    for size in (0, 10):
        src = tmp_path / f"f{size}"
        src.write_bytes(os.urandom(size))
        manifest = carry.split(src, tmp_path / "parts", part_mib=1)
        assert len(json.loads(manifest.read_text())["parts"]) == 1
        assert carry.join(manifest, tmp_path / "back").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("damage", ["missing", "cut short", "altered"])
def test_a_bad_part_is_named_and_nothing_is_written(split_file, damage):
    part = split_file["dirs"][1] / split_file["parts"][1]["file"]
    if damage == "missing":
        part.unlink()
    elif damage == "cut short":
        part.write_bytes(part.read_bytes()[:-1])
    else:
        raw = bytearray(part.read_bytes())
        raw[1000] ^= 0xFF
        part.write_bytes(bytes(raw))
    with pytest.raises(carry.CarryError, match=part.name) as err:
        carry.join(split_file["manifest"], split_file["dest"], split_file["dirs"])
    assert "carry it" in str(err.value)
    assert not split_file["dest"].exists() or not list(split_file["dest"].iterdir())


def test_parts_of_another_split_are_refused_whole(split_file):
    """Each part matches the manifest, but the manifest's whole digest is another file's: nothing is written."""
    spec = json.loads(split_file["manifest"].read_text())
    spec["sha256"] = "0" * 64
    split_file["manifest"].write_text(json.dumps(spec))
    with pytest.raises(carry.CarryError, match="another file than the one split"):
        carry.join(split_file["manifest"], split_file["dest"], split_file["dirs"])
    assert not list(split_file["dest"].iterdir())


def test_the_command_line_exits_nonzero_with_the_fix(tmp_path, split_file):
    run = lambda *a: subprocess.run([sys.executable, str(SCRIPT), *map(str, a)], capture_output=True, text=True)
    bad = tmp_path / "bad.manifest.json"
    bad.write_text("{not json")
    for args, words in [(("join", tmp_path / "none.manifest.json", tmp_path), "no manifest at"),
                        (("join", bad, tmp_path), "split the file again"),
                        (("split", tmp_path / "absent", tmp_path), "is not a file"),
                        (("join", split_file["manifest"], split_file["dest"]), "is in none of")]:
        proc = run(*args)
        assert proc.returncode == 2 and words in proc.stderr and proc.stdout == "", (args, proc.stderr)
    proc = run("join", split_file["manifest"], split_file["dest"], *split_file["dirs"])
    assert proc.returncode == 0 and "SHA-256 checked" in proc.stdout, proc.stderr
    assert (split_file["dest"] / "model.whl").read_bytes() == split_file["data"]
