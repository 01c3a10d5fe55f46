"""tasks.user_files: a user's own file through the `datasets` path, its error messages, and the local_text task."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from bench.cache import ArtifactCache
from bench.errors import ConfigError, DataError
from bench.game import Challenger
from bench.registry import TASKS
from tasks.user_files import LocalText, load_records


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_CACHE", str(tmp_path / "pbcache"))
    return ArtifactCache(tmp_path / "pbcache")


def rows(n: int, users: int | None = None) -> list[dict]:
    out = []
    for i in range(n):
        r = {"id": f"{i:03d}", "text": f"record {i}: the quick brown fox {i * 7 % 13} jumps over {i} lazy dogs"}
        if users:
            r["user"] = f"user{i % users}"
        out.append(r)
    return out


def write_jsonl(path: Path, data: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
    return path


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# -------------------------------------------------------------------------------------------------
# valid files


def test_csv_jsonl_json_parquet_load_the_same_records(tmp_path, cache):
    data = rows(5)
    files = [write_jsonl(tmp_path / "r.jsonl", data), tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.parquet"]
    files[1].write_text(json.dumps(data), encoding="utf-8")
    pd.DataFrame(data).to_csv(files[2], index=False)
    pd.DataFrame(data).to_parquet(files[3])
    results = [load_records(f, id_column="id", cache_dir=cache.root) for f in files]
    assert all(r == results[0] for r in results)
    assert [r["id"] for r in results[0]] == ["000", "001", "002", "003", "004"]  # csv ids stay strings: "000"
    assert results[0][2]["text"] == data[2]["text"]
    assert (cache.root / "hf_datasets").is_dir()  # datasets writes under the privbench cache only


def test_generated_ids_are_content_based_and_duplicate_texts_dropped(tmp_path, cache):
    data = rows(4)
    data.append(dict(data[1]))
    a = load_records(write_jsonl(tmp_path / "a.jsonl", data), cache_dir=cache.root)
    b = load_records(write_jsonl(tmp_path / "b.jsonl", list(reversed(data))), cache_dir=cache.root)
    assert len(a) == 4 and len({r["id"] for r in a}) == 4
    assert {r["id"]: r["text"] for r in a} == {r["id"]: r["text"] for r in b}
    assert all(r["id"].startswith("r-") for r in a)


def test_csv_keeps_na_strings_and_users(tmp_path, cache):
    p = tmp_path / "u.csv"
    p.write_text("text,who\nNA,7\nnull,8\n", encoding="utf-8")
    recs = load_records(p, user_column="who", cache_dir=cache.root)
    assert [(r["text"], r["user"]) for r in recs] == [("NA", "7"), ("null", "8")]


def test_format_override_and_utf8_bom(tmp_path, cache):
    p = tmp_path / "data.txt"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "h\u00e9llo w\u00f6rld"}).encode() + b"\n")
    assert load_records(p, format="jsonl", cache_dir=cache.root)[0]["text"] == "h\u00e9llo w\u00f6rld"


def test_no_write_to_default_hf_cache(tmp_path, cache):
    import datasets.config
    default = Path(datasets.config.HF_DATASETS_CACHE)
    before = set(default.iterdir()) if default.exists() else set()  # datasets puts its lock files at the top
    load_records(write_jsonl(tmp_path / "x.jsonl", rows(3)), cache_dir=cache.root)
    after = set(default.iterdir()) if default.exists() else set()
    assert after == before


# -------------------------------------------------------------------------------------------------
# errors: one line, naming the file and the fix


def _bad(tmp_path: Path, kind: str) -> tuple[Path, dict, str]:
    """(file, load_records kwargs, a phrase the message must contain)."""
    p = tmp_path / f"bad_{kind}.jsonl"
    if kind == "missing":
        return tmp_path / "nope.jsonl", {}, "no such file"
    if kind == "extension":
        p = tmp_path / "bad.xlsx"
        p.write_text("x")
        return p, {}, "unknown extension '.xlsx'"
    if kind == "zero_bytes":
        p.write_bytes(b"")
        return p, {}, "0 bytes"
    if kind == "blank_lines":
        p.write_text("\n\n  \n")
        return p, {}, "0 records"
    if kind == "csv_header_only":
        p = tmp_path / "bad.csv"
        p.write_text("id,text\n")
        return p, {}, "0 records"
    if kind == "parquet_zero_rows":
        p = tmp_path / "bad.parquet"
        pd.DataFrame({"text": pd.Series([], dtype=str)}).to_parquet(p)
        return p, {}, "0 records"
    if kind == "not_parquet":
        p = tmp_path / "bad.parquet"
        p.write_text("hello")
        return p, {}, "not a readable Parquet file"
    if kind == "latin1":
        p.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
        return p, {}, "byte 0xe9 at byte offset 28 (line 2)"
    if kind == "latin1_csv":
        p = tmp_path / "bad.csv"
        p.write_bytes(b"text\ncaf\xe9\n")
        return p, {}, "byte offset 8"
    if kind == "malformed_line":
        p.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c",}\n')
        return p, {}, "line 3 is not valid JSON"
    if kind == "not_object":
        p.write_text('{"text": "a"}\n["b"]\n')
        return p, {}, "line 2 is a JSON list"
    if kind == "json_object":
        p = tmp_path / "bad.json"
        p.write_text(json.dumps({"data": [{"text": "a"}]}))
        return p, {}, "under 'data'"
    if kind == "missing_text":
        write_jsonl(p, [{"body": "a", "id": 1}])
        return p, {}, "columns present: 'body', 'id'"
    if kind == "empty_text":
        write_jsonl(p, [{"text": "a"}, {"text": "  "}])
        return p, {}, "line 2: 'text' is empty"
    if kind == "null_text":
        write_jsonl(p, [{"text": "a"}, {"other": 1}])
        return p, {}, "line 2: 'text' is empty"
    if kind == "non_string_text":
        write_jsonl(p, [{"text": 1}, {"text": 2}])
        return p, {}, "is a int"
    if kind == "duplicate_ids":
        write_jsonl(p, [{"id": 1, "text": "a"}, {"id": 2, "text": "b"}, {"id": 1, "text": "c"}])
        return p, {"id_column": "id"}, "duplicate id '1' (line 1 and line 3)"
    if kind == "missing_id_column":
        write_jsonl(p, [{"text": "a"}])
        return p, {"id_column": "uid"}, "no id column 'uid'"
    if kind == "missing_user_column":
        write_jsonl(p, [{"text": "a", "sender": "x"}])
        return p, {"user_column": "user"}, "no user column 'user' (columns present: 'text', 'sender')"
    if kind == "empty_user":
        write_jsonl(p, [{"text": "a", "user": "x"}, {"text": "b", "user": None}])
        return p, {"user_column": "user"}, "user column 'user' is empty"
    raise AssertionError(kind)


ERROR_CASES = ["missing", "extension", "zero_bytes", "blank_lines", "csv_header_only", "parquet_zero_rows",
               "not_parquet", "latin1", "latin1_csv", "malformed_line", "not_object", "json_object", "missing_text",
               "empty_text", "null_text", "non_string_text", "duplicate_ids", "missing_id_column",
               "missing_user_column", "empty_user"]


@pytest.mark.parametrize("kind", ERROR_CASES)
def test_bad_files_give_one_line_data_errors_naming_the_file(tmp_path, cache, kind):
    path, kwargs, phrase = _bad(tmp_path, kind)
    with pytest.raises(DataError) as exc:
        load_records(path, cache_dir=cache.root, **kwargs)
    msg = one_line(exc)
    assert path.name in msg, msg
    assert phrase in msg, msg
    assert ": " in msg.split(phrase, 1)[1] or "use" in msg or "give" in msg  # a fix follows


def test_directory_is_not_a_file(tmp_path, cache):
    d = tmp_path / "d.jsonl"
    d.mkdir()
    with pytest.raises(DataError, match="is a directory"):
        load_records(d, cache_dir=cache.root)


# -------------------------------------------------------------------------------------------------
# the local_text task


def small_world() -> dict:
    return {"n_per_group": 4, "n_null": 8, "adapt_background": 4}


def test_local_text_builds_partitions_and_plays_with_the_challenger(tmp_path, cache):
    data_file = write_jsonl(tmp_path / "mine.jsonl", rows(240))
    pre = write_jsonl(tmp_path / "pre.jsonl", [{"text": f"pretraining text {i}"} for i in range(30)]
                      + [{"text": rows(1)[0]["text"]}])  # also a task record: removed from pretraining
    task = TASKS.create("local_text", {"path": str(data_file), "id_column": "id", "pretrain_path": str(pre)})
    d = task.build(cache)
    assert d.relation == "iid" and d.unit == "record" and d.public_format is None
    assert len(d.pretrain) == 30 and d.stats["pretrain_removed_as_task_records"] == 1
    sizes = [len(d.heldout), len(d.population), len(d.adapt), len(d.targets)]
    assert sum(sizes) == 240 and min(sizes) > 0
    texts = list(d.heldout) + list(d.population) + list(d.adapt) + [t.text for t in d.targets]
    assert len(set(texts)) == 240 and not set(texts) & set(d.pretrain)
    assert all(t.id.isdigit() for t in d.targets)
    again = LocalText(path=str(data_file), id_column="id", pretrain_path=str(pre)).build(cache)
    assert again.fingerprint == d.fingerprint and again.targets == d.targets
    other = LocalText(path=str(data_file), id_column="id", pretrain_path=str(pre), salt="x").build(cache)
    assert other.fingerprint != d.fingerprint

    ch = Challenger(d, small_world(), seed=0)
    assert len(ch.target_texts()) == 4 * 4 + 8  # the four groups and the null pool
    assert ch.pooled  # targets and background from the adaptation and target partitions, split anew (bench.pools)
    assert set(ch.pretraining_inserts()) <= {t.text for t in d.targets} | set(d.adapt)
    assert len(ch.adaptation_data().texts) == 4 + 8


def test_local_text_users_stay_together(tmp_path, cache):
    f = tmp_path / "users.parquet"
    pd.DataFrame(rows(300, users=60)).to_parquet(f)
    pre = write_jsonl(tmp_path / "pre.jsonl", [{"text": f"pretraining text {i}"} for i in range(10)])
    d = LocalText(path=str(f), user_column="user", pretrain_path=str(pre)).build(cache)
    assert d.unit == "user"
    assert set(d.target_meta) == {t.id for t in d.targets}
    target_users = {m["user"] for m in d.target_meta.values()}
    by_text = {r["text"]: r["user"] for r in rows(300, users=60)}
    for pool in (d.heldout, d.population, d.adapt):
        assert not {by_text[t] for t in pool} & target_users
    assert d.stats["users"] == 60


def test_local_text_default_pretraining_is_mini_pile(tmp_path, cache):
    d = LocalText(path=str(write_jsonl(tmp_path / "m.jsonl", rows(120)))).build(cache)
    assert d.relation == "ood" and len(d.pretrain) > 1000
    assert any(s.get("name") == "mini_pile" for s in d.sources)


def test_local_text_too_small_names_the_file(tmp_path, cache):
    f = write_jsonl(tmp_path / "tiny.jsonl", rows(3))
    with pytest.raises(DataError) as exc:
        LocalText(path=str(f), pretrain_path=str(f)).build(cache)
    msg = one_line(exc)
    assert "tiny.jsonl" in msg and "is empty" in msg and "add more rows" in msg


def test_local_text_needs_a_path():
    with pytest.raises(ConfigError, match="'path' is required"):
        LocalText()
    with pytest.raises(ConfigError, match="use one of"):
        LocalText(path="x.jsonl", format="xlsx")


def test_local_text_bad_file_surfaces_as_data_error(tmp_path, cache):
    f = tmp_path / "b.jsonl"
    f.write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(DataError, match=r"b\.jsonl: line 2 is not valid JSON"):
        LocalText(path=str(f)).build(cache)


def test_offline_env_is_respected():
    assert os.environ.get("HF_DATASETS_OFFLINE") == "1"  # conftest: every read above ran offline
