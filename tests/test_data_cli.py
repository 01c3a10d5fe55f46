"""Tests for `privbench data` (tasks.cli): list, show, build, report and one-line errors."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

import bench.cli as cli
from bench.cache import ArtifactCache
from tasks.cli import data_app, make_task, offline_splits, parse_name, parse_params, split_label
from bench.errors import ConfigError, DataError, RegistryError

runner = CliRunner()
SMALL = ["--params", "max_chars_per_source=300000"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    # shared with test_distance within one session: each split and embedding is built once
    path = tmp_path_factory.getbasetemp() / "privbench-data-cache"
    ArtifactCache(path)
    return str(path)


def invoke(*args):
    return runner.invoke(data_app, [str(a) for a in args])


def test_split_names():
    assert parse_name("pile_subset:wiki") == ("pile_subset", {"subset": "wiki"})
    assert parse_name("canaries:rare") == ("canaries", {"prefix_type": "rare"})
    assert parse_name("mini_pile") == ("mini_pile", {})
    assert make_task("canaries:invisible").config["prefix_type"] == "invisible"
    assert parse_params(["max_chars_per_source=300000", "salt=123", "sources=stdlib_code,shakespeare"],
                        "mini_pile") == {"max_chars_per_source": 300000, "salt": "123",
                                         "sources": ["stdlib_code", "shakespeare"]}
    assert split_label("pile_subset:wiki", {"relation": "overlap"}) == "pile_subset:wiki[relation=overlap]"
    names = offline_splits()
    assert {"mini_pile", "pile_subset:dialogue_de", "canaries:common", "names2ids",
            "random_word_canaries"} <= set(names)
    assert not any(n.startswith(("samsum", "mimir", "local_text")) for n in names)


def test_list_table(tmp_path):
    result = invoke("list", "--cache", tmp_path)
    assert result.exit_code == 0, result.output
    out = result.output
    for name in ("mini_pile", "pile_subset:wiki", "pile_subset:dialogue_en", "canaries:invisible", "names2ids"):
        assert name in out
    assert "CC BY-SA 3.0" in out and "PSF-2.0" in out
    head, needs = out.split("NEEDS A SOURCE")
    head, per_suite = head.split("BUILT WHEN A SUITE USES THEM")
    assert "local_text" in needs and "samsum" in needs and "local_text" not in head
    assert {"secrets", "secrets_replaced", "synthetic_users"} <= set(per_suite.split())
    assert "secrets" not in needs.split() and "secrets:" not in needs


def test_list_json(tmp_path):
    result = invoke("list", "--format", "json", "--cache", tmp_path)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rows = {r["name"]: r for r in data["splits"]}
    assert list(rows) == offline_splits()
    assert rows["pile_subset:news"]["relation"] == "ood" and rows["pile_subset:code"]["relation"] == "iid"
    assert all(r["built"] == "no" and r["licenses"] and r["membership"] == "record" for r in rows.values())
    assert {"mimir", "pile_split", "samsum", "german_wiki", "enron_users", "local_text"} <= \
        {r["name"] for r in data["needs_source"]}
    assert all(r["description"] for r in data["needs_source"])
    per_suite = {r["name"] for r in data["built_per_suite"]}
    assert {"secrets", "secrets_replaced", "synthetic_users"} <= per_suite
    assert not per_suite & {r["name"] for r in data["needs_source"]}


def test_build_one_small_split_then_cached(cache_dir):
    result = invoke("build", "mini_pile", *SMALL, "--cache", cache_dir)
    assert result.exit_code == 0, result.output
    assert "[1/1] mini_pile" in result.output and "1 split(s) ready" in result.output
    again = invoke("build", "mini_pile", *SMALL, "--cache", cache_dir)
    assert again.exit_code == 0 and "cached" in again.output


def test_show_mini_pile(cache_dir):
    result = invoke("show", "mini_pile", *SMALL, "--cache", cache_dir)
    assert result.exit_code == 0, result.output
    out = result.output
    data = make_task("mini_pile", {"max_chars_per_source": 300000}).build(ArtifactCache(cache_dir))
    assert f"fingerprint: {data.fingerprint}" in out
    assert "relation: iid" in out and "membership unit: record" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("targets "))
    assert line.split()[1:] == [str(len(data.targets)), str(sum(len(t.text) for t in data.targets))]
    assert out.count("license:") == 2 and out.count("provenance:") == 2 and "PSF" in out
    samples = out.split("sample targets")[1]
    assert samples.count("  --- ") == 3
    assert data.targets[0].id in samples
    body = [ln for ln in samples.splitlines() if ln.startswith("  ") and not ln.startswith("  --- ")]
    assert sum(len(ln) - 2 for ln in body) <= 3 * 204


@pytest.mark.parametrize("argv, exc, words", [
    (["show", "mini_pil"], RegistryError, "did you mean 'mini_pile'?"),
    (["show", "pile_subset:wikii"], ConfigError, "did you mean 'pile_subset:wiki'?"),
    (["build", "no_such_split"], RegistryError, "unknown data split 'no_such_split'"),
    (["show", "mini_pile", "--params", "max_chars=5"], ConfigError, "unknown parameter 'max_chars'"),
])
def test_unknown_names_fail_with_one_line(argv, exc, words, tmp_path):
    result = invoke(*argv, "--cache", tmp_path)
    assert result.exit_code != 0
    assert isinstance(result.exception, exc)
    message = str(result.exception)
    assert "\n" not in message and words in message


def test_mounted_under_privbench_errors_are_one_line(monkeypatch, capsys, tmp_path):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.add_typer(data_app, name="data")
    monkeypatch.setattr(cli, "app", app)  # what `app.add_typer(data_app, name="data")` in bench/cli.py gives
    rc = cli.main(["data", "show", "mini_pil", "--cache", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.strip().splitlines() == ["error: unknown data split 'mini_pil': did you mean 'mini_pile'?"]


def test_report_prints_the_numbers_when_the_criterion_fails(monkeypatch, tmp_path):
    import tasks.distance as distance

    rows = [{"split": "pile_subset:code", "relation": "iid", "n_pool": 600, "n": 200, "w_mean": 1.30, "w_min": 1.10,
             "nearest": "stdlib_code", "w_all": 1.2, "w:stdlib_code": 1.10},
            {"split": "pile_subset:news", "relation": "ood", "n_pool": 270, "n": 200, "w_mean": 1.25, "w_min": 1.20,
             "nearest": "stdlib_code", "w_all": 1.3, "w:stdlib_code": 1.20}]
    monkeypatch.setattr(distance, "distance_report", lambda *a, **k: rows)
    result = invoke("report", "--cache", tmp_path)
    assert result.exit_code == 0, result.output
    assert "w_mean: DOES NOT HOLD: min ood 1.2500 (pile_subset:news) <= max iid 1.3000 (pile_subset:code)" \
        in result.output
    assert "pile_subset:code >= pile_subset:news" in result.output
    assert "w_min: holds" in result.output
    assert "ood farther than iid (w_mean and w_min): NO" in result.output
    js = invoke("report", "--format", "json", "--cache", tmp_path)
    assert json.loads(js.output)["ood_farther_than_iid"] is False


def test_report_small_real(cache_dir):
    from tasks.distance import load_model
    try:
        load_model()
    except DataError as exc:
        pytest.skip(f"sentence-embedding model unavailable ({exc})")
    result = invoke("report", "pile_subset:books", "pile_subset:dialogue_en", "--params",
                    "pretrain_sources=stdlib_code,shakespeare", "--params", "max_chars_per_source=100000",
                    "--n", "24", "--format", "json", "--cache", cache_dir)
    assert result.exit_code == 0, result.output
    blob = json.loads(result.output[result.output.index("{"):])
    assert [r["relation"] for r in blob["rows"]] == ["iid", "ood"]
    assert blob["ood_farther_than_iid"] is True
