"""Tests for the offline mini-Pile subsets (tasks.pile_subsets) and their sources (tasks.sources).

The leakage checks extract word 13-grams here, independently of the product's hashing code.
"""

from __future__ import annotations

import importlib.util

import pytest

from bench.cache import ArtifactCache
from bench.errors import ConfigError, DataError
from bench.registry import TASKS
from bench.task import TaskData
from tasks.corpus import build_corpus
from tasks.pile_subsets import DEFAULT_PRETRAIN_SOURCES, SUBSETS, PileSubset, build_subset
from tasks.sources import (
    SOURCES,
    DialogueSource,
    NewsSource,
    WikipediaSource,
    format_conversation,
    get_source,
    strip_wiki_markup,
)

BUDGET = 300_000  # per source: small, but every pool of every subset is non-empty at this size
CASES = [(name, "auto") for name in SUBSETS] + [("wiki", "overlap")]
POOLS = ("heldout", "population", "adapt", "targets")
WIKI_MARKUP = ("{{", "}}", "[[", "]]", "<ref", "{|", "|}")


def _grams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    toks = text.lower().split()
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def _all_grams(texts) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for t in texts:
        out |= _grams(t)
    return out


def _pool(data: TaskData, name: str) -> tuple[str, ...]:
    return tuple(t.text for t in data.targets) if name == "targets" else getattr(data, name)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, str], TaskData]:
    cache = ArtifactCache(tmp_path_factory.mktemp("cache"))
    return {(s, r): PileSubset(subset=s, relation=r, max_chars_per_source=BUDGET).build(cache) for s, r in CASES}


@pytest.fixture(scope="module")
def pretrain_grams(built) -> set[tuple[str, ...]]:
    return _all_grams(built[("code", "auto")].pretrain)


# --------------------------------------------------------------------------- builds


def test_every_subset_builds(built):
    for (subset, relation), data in built.items():
        assert data.name == f"pile_subset:{subset}"
        assert data.relation == (SUBSETS[subset]["relation"] if relation == "auto" else relation)
        assert data.targets and data.adapt and data.heldout and data.population, subset
        assert data.unit == "record" and len(data.fingerprint) == 64
        for part in ("pretrain",) + POOLS:
            assert data.stats[part]["n_records"] == len(_pool(data, part)), (subset, part)
        assert data.stats["meta"]["subset"] == subset
        ids = [t.id for t in data.targets]
        assert len(ids) == len(set(ids))
        source = SUBSETS[subset]["source"]
        assert all(i.startswith(source + "-") for i in ids)
        for part in POOLS:
            assert all(120 <= len(t) <= 320 for t in _pool(data, part)), (subset, part)


def test_two_builds_identical(built, tmp_path):
    fresh = ArtifactCache(tmp_path / "fresh")
    for (subset, relation), data in built.items():
        again = PileSubset(subset=subset, relation=relation, max_chars_per_source=BUDGET).build(fresh)
        assert again.fingerprint == data.fingerprint, subset
        assert again == data, subset  # every tuple, stats and sources


def test_salt_changes_partitions(built):
    for subset in ("wiki", "news"):
        base = built[(subset, "auto")]
        other = build_subset(subset, max_chars_per_source=BUDGET, salt="another-salt")
        assert other.fingerprint() != base.fingerprint
        assert [r.text for r in other.partitions["targets"]] != [t.text for t in base.targets]
        assert [r.text for r in other.partitions["pretrain"]] != list(base.pretrain)


def test_iid_and_ood_share_the_pretrain_partition(built):
    reference = build_corpus(DEFAULT_PRETRAIN_SOURCES, max_chars_per_source=BUDGET).texts("pretrain")
    relations = set()
    shared = built[("code", "auto")].stats["meta"]["pretrain_fingerprint"]
    for data in built.values():
        relations.add(data.relation)
        assert data.pretrain == tuple(reference)
        assert data.stats["meta"]["pretrain_fingerprint"] == shared
    assert relations == {"iid", "ood", "overlap"}
    pretrain_sources = {s["name"] for s in built[("code", "auto")].sources if "pretrain" in s["role"]}
    assert pretrain_sources == set(DEFAULT_PRETRAIN_SOURCES)


# --------------------------------------------------------------------------- leakage


def test_no_member_nonmember_leakage(built):
    for (subset, _), data in built.items():
        members = _all_grams(list(data.adapt) + [t.text for t in data.targets])
        for part in ("heldout", "population"):
            for text in _pool(data, part):
                assert not (_grams(text) & members), (subset, part, text[:80])
        pools = {p: set(_pool(data, p)) for p in POOLS}
        assert not (pools["heldout"] | pools["population"]) & (pools["adapt"] | pools["targets"])


def test_no_overlap_with_pretrain(built, pretrain_grams):
    assert len(pretrain_grams) > 10_000
    for (subset, _), data in built.items():
        checked = POOLS if data.relation != "overlap" else ("heldout", "population")
        pretrain = set(data.pretrain)
        for part in checked:
            for text in _pool(data, part):
                assert text not in pretrain, (subset, part)
                assert not (_grams(text) & pretrain_grams), (subset, part, text[:80])


def test_overlap_targets_are_pretraining_records(built):
    data = built[("wiki", "overlap")]
    assert data.relation == "overlap"
    pretrain = set(data.pretrain)
    assert all(t.text in pretrain for t in data.targets)
    assert all(t in pretrain for t in data.adapt)
    # held-out pools are shared with the iid variant of the same subset
    iid = built[("wiki", "auto")]
    assert iid.relation == "iid"
    assert data.heldout == iid.heldout and data.population == iid.population
    assert not {t.text for t in iid.targets} & pretrain


def test_overlap_worlds_draw_targets_and_background_from_one_pool(built):
    """The overlap subset keeps each record's document, so its worlds pool adaptation and target records and split
    them by document under the world's salt: the background is no longer the adaptation partition, and a record's
    public partition says nothing about whether it is a target (tests/test_pools.py has the exploit)."""
    from bench.game import Challenger
    data = built[("wiki", "overlap")]
    assert data.adapt_docs is not None and data.target_docs is not None
    ch = Challenger(data, {"n_per_group": 10, "n_null": 20, "adapt_background": 20}, seed=0, secret="s")
    assert ch.pooled and ch.a_uncontrolled
    inserted = set(ch.members("b"))
    background = [t for t in ch.adaptation_data().texts if t not in inserted]
    partition = {t.text for t in data.targets}
    assert 0 < sum(t in partition for t in background) < len(background)
    assert set(background) <= set(data.pretrain)  # every record of an overlap world is in S


def test_relation_must_match_the_mixture():
    with pytest.raises(ConfigError, match="remove it"):
        PileSubset(subset="code", relation="ood")
    with pytest.raises(ConfigError, match="pretrain_sources"):
        PileSubset(subset="news", relation="iid")
    with pytest.raises(ConfigError, match="pretrain_sources"):
        PileSubset(subset="dialogue_de", relation="overlap")
    with pytest.raises(ConfigError):
        PileSubset(subset="nope")
    assert PileSubset(subset="news", pretrain_sources=["stdlib_code", "news"]).resolved_relation == "iid"
    assert PileSubset(subset="wiki", pretrain_sources=["stdlib_code"]).resolved_relation == "ood"


# --------------------------------------------------------------------------- sources


def test_provenance_recorded(built):
    for (subset, _), data in built.items():
        names = [s["name"] for s in data.sources]
        assert SUBSETS[subset]["source"] in names
        for entry in data.sources:
            for key in ("name", "license", "provenance"):
                assert isinstance(entry[key], str) and entry[key].strip(), (subset, entry)
            assert entry["role"] in ("pretrain", "subset", "pretrain+subset")
    for name in ("wikipedia", "news", "dialogue_en", "dialogue_de"):
        info = get_source(name).info
        assert info.license and info.provenance and info.version and info.kind in ("prose", "dialogue")
    assert "CC BY-SA" in get_source("wikipedia").info.license
    assert "BSD" in get_source("dialogue_de").info.license
    assert {"stdlib_code", "shakespeare", "wikipedia", "news", "dialogue_en", "dialogue_de"} <= set(SOURCES)
    assert TASKS.get("pile_subset") is PileSubset


def test_wiki_records_are_clean(built):
    data = built[("wiki", "auto")]
    for part in POOLS:
        for text in _pool(data, part):
            assert not any(tok in text for tok in WIKI_MARKUP), text[:120]
    docs = list(get_source("wikipedia").documents())
    assert len(docs) > 500 and len({d.doc_id.rsplit("#", 1)[0] for d in docs}) > 90
    for doc in docs:
        assert not any(tok in doc.text for tok in WIKI_MARKUP), doc.doc_id
        assert "#REDIRECT" not in doc.text.upper()


def test_strip_wiki_markup_snippet():
    raw = (
        "{{Infobox person\n| name = {{nowrap|Jane Doe}}\n| born = {{birth date|1900|1|1}}\n}}\n"
        "'''Jane Doe''' ({{lang|fr|Jeanne}}; born 1900) was a [[France|French]] [[novelist]]s writer."
        '<ref name="a">{{cite web|url=http://x.org|title={{!}}T}}</ref> She lived in [[Paris]].<ref name="a"/>\n'
        "<!-- hidden\ncomment -->\n"
        '{| class="wikitable"\n|-\n| cell {{x}} || [[y]]\n{| nested\n| z\n|}\n|}\n'
        "== Life ==\n"
        "She wrote [[File:Jane.jpg|thumb|Jane with a [[cat|kitten]]]] many ''books'', see "
        "[http://example.com her site] &amp; more.\n"
        "* A list item with {{convert|5|km}}.\n"
        "=== Empty ===\n"
        "== References ==\n{{reflist}}\n* [[Book One]]\n"
        "[[Category:Writers]]\n[[fr:Jeanne Doe]]\n"
    )
    assert strip_wiki_markup(raw) == (
        "Jane Doe (Jeanne; born 1900) was a French novelists writer. She lived in Paris.\n\n"
        "Life\n\n"
        "She wrote many books, see her site & more.\nA list item with 5 km."
    )
    # unbalanced markup never leaks into the text
    assert strip_wiki_markup("Intro text here.\n{{unclosed|template\n\nNext paragraph [[dangling") == \
        "Intro text here.\n\nNext paragraph"


def test_dialogue_format_and_packing(tmp_path):
    assert format_conversation(["Hi", " Hello ", "", 42]) == "A: Hi\nB: Hello\nA: 42"
    assert format_conversation(["Hi", {"key": "value"}]) == ""
    lang = tmp_path / "german"
    lang.mkdir()
    convs = "\n".join(f"- - Frage Nummer {i}, wie geht es dir heute?\n  - 'Antwort {i}: gut, danke.'"
                      for i in range(12))
    (lang / "b.yml").write_text("categories:\n- test\nconversations:\n" + convs + "\n", encoding="utf-8")
    (lang / "a.yml").write_text(
        "conversations:\n- - Hallo\n  - Hi\n- not a list\n- - Frage\n  - Antwort: eine Abbildung\n", encoding="utf-8")
    src = DialogueSource("de", data_dir=tmp_path)
    assert src.name == "dialogue_de" and src.info.kind == "dialogue"
    docs = list(src.documents())
    assert [d.doc_id for d in docs][:2] == ["german/a.yml#0", "german/b.yml#0"]
    assert docs[0].text == "A: Hallo\nB: Hi"
    for doc in docs[1:]:
        assert len(doc.text) <= DialogueSource.PACK_CHARS
        for conv in doc.text.split("\n\n"):
            lines = conv.split("\n")
            assert len(lines) == 2 and lines[0].startswith("A: Frage") and lines[1].startswith("B: Antwort")
    assert sum(d.text.count("A: Frage") for d in docs) == 12
    assert docs == list(DialogueSource("german", data_dir=tmp_path).documents())


def test_real_dialogue_and_news_sources():
    de = list(get_source("dialogue_de").documents())
    en = list(get_source("dialogue_en").documents())
    assert len(de) >= 30 and len(en) > len(de) * 10
    assert all(d.text.startswith("A: ") for d in de + en)
    news = list(get_source("news").documents())
    assert len(news) >= 290 and all(d.doc_id.startswith("lee_background.cor#") for d in news)


def test_missing_packages_raise_data_error(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gensim", "chatterbot_corpus") else real(name, *a))
    with pytest.raises(DataError, match="pip install gensim==4.4.0"):
        WikipediaSource()
    with pytest.raises(DataError, match="pip install gensim==4.4.0"):
        NewsSource()
    with pytest.raises(DataError, match="pip install --no-deps chatterbot-corpus==1.3.3"):
        get_source("dialogue_en")
    with pytest.raises(DataError, match="chatterbot-corpus"):
        DialogueSource("de", data_dir=tmp_path)
