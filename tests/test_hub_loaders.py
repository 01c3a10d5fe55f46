"""tasks.hub: every loader on local parquet and JSON-lines copies in the hub's schema, and hub ids offline.

No test touches the network: local copies are written to tmp_path, and hub ids run with the hub offline
(or an unreachable endpoint), where the loaders must fail fast with a DataError that says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench.cache import ArtifactCache
from bench.errors import DataError
from bench.game import GAMES, Challenger
from bench.modeling import resolve_spec
from bench.registry import TASKS
from tasks import hub
from tasks.hub import (
    PYTHIA_SPECS, EnronUsers, GermanWiki, Mimir, PileSplit, SamSum, is_local_source, known_membership,
)

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def sentence(i: int, tag: str, n: int = 12) -> str:
    return f"{tag} {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_CACHE", str(tmp_path / "pbcache"))
    return ArtifactCache(tmp_path / "pbcache")


@pytest.fixture
def pretrain_file(tmp_path) -> str:
    p = tmp_path / "pretrain.jsonl"
    p.write_text("".join(json.dumps({"text": sentence(i, "pretraining")}) + "\n" for i in range(20)))
    return str(p)


def write(df: pd.DataFrame, path: Path, fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        df.to_parquet(path)
    else:
        df.to_json(path, orient="records", lines=True, force_ascii=False)
    return path


FORMATS = ["parquet", "jsonl"]


# -------------------------------------------------------------------------------------------------
# MIMIR


def mimir_frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"member": [sentence(i, "member") for i in range(n)],
                         "nonmember": [sentence(i, "nonmember") for i in range(n)],
                         "member_neighbors": [[sentence(i, "nb")] for i in range(n)]})


@pytest.mark.parametrize("fmt", FORMATS)
def test_mimir_local_file_and_hub_layout(tmp_path, cache, fmt):
    f = write(mimir_frame(120), tmp_path / f"m.{fmt}", fmt)
    d = Mimir(source=str(f)).build(cache)
    assert d.relation == "overlap" and d.unit == "record" and d.public_format is None and d.pretrain == ()
    km = known_membership(d)
    assert set(km) == {t.id for t in d.targets}
    members = {t.id for t in d.targets if km[t.id] == 1}
    assert len(members) == 120
    assert {t.text for t in d.targets if t.id in members} == set(mimir_frame(120)["member"])
    n_nonmember_targets = len(d.targets) - 120
    assert n_nonmember_targets + len(d.heldout) + len(d.population) + len(d.adapt) == 120
    assert min(n_nonmember_targets, len(d.heldout), len(d.population), len(d.adapt)) > 0
    pools = set(d.heldout) | set(d.population) | set(d.adapt)
    assert pools <= set(mimir_frame(120)["nonmember"])  # the attacker and the defense see non-members only
    # the same directory layout as the hub: <config>/<split>.<ext>
    write(mimir_frame(120), tmp_path / "copy" / "github" / f"ngram_7_0.2.{fmt}", fmt)
    d2 = Mimir(source=str(tmp_path / "copy"), config_name="github", split="ngram_7_0.2").build(cache)
    assert [t.id for t in d2.targets] == [t.id for t in d.targets]  # ids from content: deterministic
    assert Mimir(source=str(f)).build(cache).fingerprint == d.fingerprint
    assert len(Mimir(source=str(f), n=50).build(cache).targets) < len(d.targets)


def test_mimir_parquet_and_jsonl_give_the_same_targets(tmp_path, cache):
    a = Mimir(source=str(write(mimir_frame(60), tmp_path / "a.parquet", "parquet"))).build(cache)
    b = Mimir(source=str(write(mimir_frame(60), tmp_path / "b.jsonl", "jsonl"))).build(cache)
    assert a.targets == b.targets and a.target_meta == b.target_meta and a.heldout == b.heldout


def test_mimir_missing_column_lists_columns(tmp_path, cache):
    f = write(pd.DataFrame({"text": ["a b c"], "label": [1]}), tmp_path / "wrong.parquet", "parquet")
    with pytest.raises(DataError, match=r"wrong\.parquet: no column 'member', 'nonmember' \(columns present: 'text'"):
        Mimir(source=str(f)).build(cache)


def test_mimir_directory_without_the_split(tmp_path, cache):
    write(mimir_frame(5), tmp_path / "copy" / "pile_cc" / "other.parquet", "parquet")
    with pytest.raises(DataError, match=r"no data for split 'ngram_13_0.8' of config 'pile_cc'.*pile_cc/other"):
        Mimir(source=str(tmp_path / "copy")).build(cache)


# -------------------------------------------------------------------------------------------------
# the Pile's own train / validation split


def pile_frame(n: int, tag: str, meta_as_string: bool = False) -> pd.DataFrame:
    sets = ["Github", "Enron Emails", "Github", "BookCorpus2"]
    meta = [{"pile_set_name": sets[i % 4]} for i in range(n)]
    return pd.DataFrame({"text": [sentence(i, tag) for i in range(n)],
                         "meta": [json.dumps(m) for m in meta] if meta_as_string else meta})


@pytest.mark.parametrize("fmt", FORMATS)
def test_pile_split_members_from_train_nonmembers_from_validation(tmp_path, cache, fmt):
    train, val = pile_frame(400, "train"), pile_frame(400, "val")
    val.loc[0, "text"] = train.loc[0, "text"]  # in both splits: really a member
    write(train, tmp_path / "pile" / f"train.{fmt}", fmt)
    write(val, tmp_path / "pile" / f"validation.{fmt}", fmt)
    d = PileSplit(source=str(tmp_path / "pile"), subset="Github", n=150).build(cache)
    km = known_membership(d)
    assert d.relation == "overlap" and d.pretrain == ()
    assert sum(km.values()) == 150  # first 150 Github rows of train
    members = {t.text for t in d.targets if km[t.id] == 1}
    assert members == set(train["text"][train.index % 2 == 0][:150])
    nonmember_texts = {t.text for t in d.targets if km[t.id] == 0} | set(d.heldout) | set(d.population) | set(d.adapt)
    assert len(nonmember_texts) == 149 and train.loc[0, "text"] not in nonmember_texts
    assert d.stats["texts_on_both_sides_dropped_from_nonmembers"] == 1
    assert all(t.startswith("val") for t in nonmember_texts)


def test_pile_split_meta_as_json_string_and_all_subsets(tmp_path, cache):
    write(pile_frame(80, "train", True), tmp_path / "p" / "data" / "train-00000-of-00001.parquet", "parquet")
    write(pile_frame(80, "val", True), tmp_path / "p" / "data" / "validation-00000-of-00001.parquet", "parquet")
    d = PileSplit(source=str(tmp_path / "p"), subset="Enron Emails", n=None).build(cache)
    assert sum(known_membership(d).values()) == 20
    d_all = PileSplit(source=str(tmp_path / "p"), subset=None, n=None).build(cache)
    assert sum(known_membership(d_all).values()) == 80


def test_pile_split_needs_two_splits_and_a_known_subset(tmp_path, cache):
    f = write(pile_frame(10, "t"), tmp_path / "one.jsonl", "jsonl")
    with pytest.raises(DataError, match="give a directory"):
        PileSplit(source=str(f)).build(cache)
    write(pile_frame(10, "t"), tmp_path / "p" / "train.jsonl", "jsonl")
    write(pile_frame(10, "v"), tmp_path / "p" / "validation.jsonl", "jsonl")
    with pytest.raises(DataError, match="no rows of subset 'Gitlab'"):
        PileSplit(source=str(tmp_path / "p"), subset="Gitlab").build(cache)


# -------------------------------------------------------------------------------------------------
# SAMSum and German Wikipedia: out-of-distribution pools


@pytest.mark.parametrize("fmt", FORMATS)
def test_samsum(tmp_path, cache, pretrain_file, fmt):
    df = pd.DataFrame({"id": [f"1373{i:04d}" for i in range(200)],
                       "dialogue": [f"Amanda: {sentence(i, 'hi')}\r\nJerry: ok {i}" for i in range(200)],
                       "summary": [f"Amanda and Jerry talk {i}." for i in range(200)]})
    df.loc[5, "dialogue"] = ""  # SAMSum has a few empty dialogues
    f = write(df, tmp_path / f"samsum.{fmt}", fmt)
    d = SamSum(source=str(f), pretrain_path=pretrain_file).build(cache)
    assert d.relation == "ood" and d.unit == "record" and not d.target_meta
    assert len(d.pretrain) == 20 and d.stats["rows_skipped"] == 1
    assert len(d.targets) + len(d.heldout) + len(d.population) + len(d.adapt) == 199
    t = next(t for t in d.targets)
    row = df[df["id"] == t.id.removeprefix("samsum-")].iloc[0]
    assert t.text == f"Dialogue:\n{row.dialogue}\nSummary: {row.summary}"
    assert SamSum(source=str(f), pretrain_path=pretrain_file).build(cache).targets == d.targets
    assert SamSum(source=str(f), pretrain_path=pretrain_file, seed=1).build(cache).targets != d.targets


@pytest.mark.parametrize("fmt", FORMATS)
def test_german_wiki(tmp_path, cache, pretrain_file, fmt):
    df = pd.DataFrame({"id": [str(i) for i in range(150)], "url": [f"https://de.wikipedia.org/wiki?curid={i}"
                                                                   for i in range(150)],
                       "title": [f"Artikel {i}" for i in range(150)],
                       "text": [f"Der Artikel {i} über Straßen und Flüsse. " * 20 for i in range(150)]})
    write(df, tmp_path / "de" / "20231101.de" / f"train.{fmt}", fmt)
    d = GermanWiki(source=str(tmp_path / "de"), max_chars=200, pretrain_path=pretrain_file, n=100).build(cache)
    assert d.relation == "ood"
    texts = [t.text for t in d.targets] + list(d.heldout) + list(d.population) + list(d.adapt)
    assert len(texts) == 100 and all(len(t) <= 200 for t in texts) and "Straßen" in texts[0]
    assert all(t.id.startswith("dewiki-") for t in d.targets)


# -------------------------------------------------------------------------------------------------
# user-level data: Enron by sender, arXiv by submitter


def users_frame(n: int, text_col: str, user_col: str, users: int) -> pd.DataFrame:
    return pd.DataFrame({text_col: [sentence(i, "mail") for i in range(n)],
                         user_col: [f"person{i % users}@enron.com" for i in range(n)]})


@pytest.mark.parametrize("fmt", FORMATS)
def test_enron_users(tmp_path, cache, pretrain_file, fmt):
    df = users_frame(400, "body", "from", 50)
    df.loc[len(df)] = [sentence(999, "lonely"), "lonely@enron.com"]  # one record only: dropped
    f = write(df, tmp_path / f"enron.{fmt}", fmt)
    d = EnronUsers(source=str(f), pretrain_path=pretrain_file, max_records_per_user=6).build(cache)
    assert d.unit == "user" and d.relation == "ood"
    assert d.stats["users"] == 50 and d.stats["users_dropped_too_few_records"] == 1
    assert set(d.target_meta) == {t.id for t in d.targets}
    users = {m["user"] for m in d.target_meta.values()}
    sender = dict(zip(df["body"], df["from"]))
    for pool in (d.heldout, d.population, d.adapt):
        assert not {sender[t] for t in pool} & users  # a user's records never straddle pools
    assert len(d.targets) + len(d.heldout) + len(d.population) + len(d.adapt) == 50 * 6


def test_arxiv_by_submitter_is_the_same_task(tmp_path, cache, pretrain_file):
    f = write(users_frame(300, "abstract", "submitter", 30), tmp_path / "arxiv.parquet", "parquet")
    d = TASKS.create("enron_users", {"source": str(f), "text_column": "abstract", "user_column": "submitter",
                                     "pretrain_path": pretrain_file}).build(cache)
    assert d.unit == "user" and len({m["user"] for m in d.target_meta.values()}) > 0
    with pytest.raises(DataError, match=r"no column 'body', 'from' \(columns present: 'abstract', 'submitter'\)"):
        EnronUsers(source=str(f), pretrain_path=pretrain_file).build(cache)


def test_pool_tasks_work_with_the_challenger(tmp_path, cache, pretrain_file):
    f = write(users_frame(400, "body", "from", 80), tmp_path / "e.jsonl", "jsonl")
    d = EnronUsers(source=str(f), pretrain_path=pretrain_file).build(cache)
    assert d.unit == "user" and all("user" in d.target_meta[t.id] for t in d.targets)
    # the game draws whole users (bench/units.py): a user's records share one group, one target per user
    ch = Challenger(d, {"n_per_group": 4, "n_null": 8, "adapt_background": 4}, seed=0)
    for t in d.targets:
        if t.id in ch._group:
            assert ch.group_of(t.id) == ch.unit_group(d.target_meta[t.id]["user"])
    assert len(ch.instance(GAMES["pretrain"]).targets) == 16 and len(ch.units()) == 16 + 8  # and the null pool
    # the adaptation data's owners are the task's users, background and targets alike
    owners = ch.adaptation_data().users
    assert owners is not None and len(set(owners[:4])) <= 4


# -------------------------------------------------------------------------------------------------
# hub ids without the hub


ALL = [(Mimir, {}), (PileSplit, {}), (SamSum, {}), (GermanWiki, {}), (EnronUsers, {})]


@pytest.fixture
def offline(monkeypatch):
    import datasets.config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("cls", [c for c, _ in ALL], ids=lambda c: c.name)
def test_hub_id_offline_fails_fast_with_advice(cache, offline, cls):
    with pytest.raises(DataError) as exc:
        cls().build(cache)
    msg = str(exc.value)
    assert "\n" not in msg
    assert cls.params[0].default in msg  # names the hub id
    assert "hub is needed" in msg and "local copy in the same schema" in msg and "`source`" in msg


def test_unreachable_hub_is_detected_before_any_download(cache, monkeypatch):
    import datasets
    import datasets.config
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port

    def no_network(*a, **k):
        raise AssertionError("load_dataset must not be called when the hub is unreachable")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(DataError, match=r"hub dataset 'knkarthick/samsum': the Hugging Face hub is needed but not "
                                        r"reachable .*local copy in the same schema"):
        SamSum().build(cache)


def test_hub_errors_are_translated():
    from datasets.exceptions import DatasetNotFoundError
    e = hub._hub_error(RuntimeError("Dataset scripts are no longer supported, but found mimir.py"),
                       "iamgroot42/mimir", "pile_cc", "ngram_13_0.8", "mimir")
    assert "script-based" in str(e) and "datasets<4" in str(e) and "`source`" in str(e)
    e = hub._hub_error(DatasetNotFoundError("Dataset 'x/y' doesn't exist on the Hub"), "x/y", None, "train", "samsum")
    assert "not found on the hub, or gated" in str(e)
    e = hub._hub_error(ValueError("BuilderConfig 'zz' not found. Available: ['a', 'b']"), "x/y", "zz", "train", "m")
    assert "unknown config" in str(e)
    e = hub._hub_error(ValueError('Unknown split "dev". Should be one of [\'train\'].'), "x/y", None, "dev", "m")
    assert "unknown split" in str(e)


def test_source_kinds(tmp_path):
    assert not is_local_source("iamgroot42/mimir") and not is_local_source("samsum")
    assert is_local_source("./mimir") and is_local_source("/data/x") and is_local_source("x.parquet")
    assert is_local_source(str(tmp_path))
    with pytest.raises(DataError, match="does not exist"):
        Mimir(source=str(tmp_path / "nope")).build(ArtifactCache(tmp_path / "c"))


# -------------------------------------------------------------------------------------------------
# registry and Pythia specs


def test_tasks_are_registered():
    assert {"mimir", "pile_split", "samsum", "german_wiki", "enron_users", "local_text"} <= set(TASKS.names())
    for name in ("mimir", "pile_split", "samsum", "german_wiki", "enron_users"):
        params = {p.name for p in TASKS.get(name).params}
        assert {"source", "config_name", "split", "n", "seed", "revision"} <= params


def test_pythia_specs_resolve_as_hf_models():
    assert PYTHIA_SPECS["pythia-70m"]["hf_id"] == "EleutherAI/pythia-70m-deduped"
    assert PYTHIA_SPECS["pythia-70m-nondedup"]["hf_id"] == "EleutherAI/pythia-70m"
    for name, params in PYTHIA_SPECS.items():
        spec = resolve_spec(name, params)
        assert spec.source == "hf" and spec.revision == "step143000" and spec.context_length == 2048
