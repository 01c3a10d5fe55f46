"""Tests for tasks.canaries: canary-prefix records (Marek et al. 2026, appendix B.5) and random-word canaries
(Segal et al. 2025).

Frequencies, formats and memberships are recomputed here independently of the module under test.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter

import numpy as np
import pytest

from bench.errors import ConfigError
from bench.game import GAMES, WORLD_PARAMS, Challenger
from bench.registry import TASKS
from tasks.canaries import (
    INVISIBLE, PREFIX_TYPES, Canaries, RandomWordCanaries, exposure_from_rank, generate_references,
    generate_word_references, random_word_references_for, references_for, split_canary,
)
from tasks.mini_pile import MiniPile

BUDGET = 300_000
WORLD = {"n_per_group": 4, "n_null": 8, "adapt_background": 10}


@pytest.fixture(scope="module")
def base(cache):
    return MiniPile(max_chars_per_source=BUDGET).build(cache)


@pytest.fixture(scope="module")
def built(cache):
    return {t: Canaries(prefix_type=t, max_chars_per_source=BUDGET).build(cache) for t in PREFIX_TYPES}


@pytest.fixture(scope="module")
def words(cache):
    return RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=200).build(cache)


def count_words(texts) -> Counter:
    # independent of tasks.canaries.word_counts: a hand-rolled scan for maximal runs of ASCII letters
    c: Counter = Counter()
    for text in texts:
        cur = []
        for ch in text + " ":
            if ("a" <= ch <= "z") or ("A" <= ch <= "Z"):
                cur.append(ch)
            elif cur:
                c["".join(cur)] += 1
                cur = []
    return c


def prefix_tokens(data, prefix: str) -> list[str]:
    return list(prefix) if data.public_format["type"] == "invisible" else prefix.split(" ")


def all_ids(ch: Challenger) -> list[str]:
    return list(ch.instance(GAMES["pretrain"]).record_ids)


# ------------------------------------------------------------------------------------------- exposure

def test_exposure_from_rank():
    assert exposure_from_rank(1, 257) == pytest.approx(math.log2(257))
    assert exposure_from_rank(257, 257) == 0.0
    assert exposure_from_rank(2, 8) == pytest.approx(2.0)
    assert exposure_from_rank(1, 1) == 0.0
    for rank, n in ((0, 10), (11, 10), (1, 0)):
        with pytest.raises(ValueError):
            exposure_from_rank(rank, n)
    assert "eq. (7)" in exposure_from_rank.__doc__


# ------------------------------------------------------------------------------------ prefix canaries

def test_registered():
    assert TASKS.get("canaries") is Canaries
    assert TASKS.get("random_word_canaries") is RandomWordCanaries
    names = {p.name for p in Canaries.params}
    assert {"prefix_type", "l", "k", "n_references", "seed", "max_chars_per_source"} <= names
    assert Canaries.info()["params"][0]["choices"] == list(PREFIX_TYPES)


@pytest.mark.parametrize("bad", [{"prefix_type": "loud"}, {"prefix_type": "invisible", "k": len(INVISIBLE) + 1},
                                 {"k": 2, "l": 4}, {"l": 0}])
def test_bad_config(bad):
    with pytest.raises(ConfigError):
        Canaries(**bad)


def test_partitions_reused(built, base):
    for t, d in built.items():
        assert d.name == "canaries"
        assert d.pretrain == base.pretrain and d.heldout == base.heldout and d.population == base.population
        assert d.adapt == base.adapt
        assert len(d.targets) == len(base.targets)
        assert d.relation == base.relation and d.unit == "record"
        assert d.fingerprint != base.fingerprint
    assert len({d.fingerprint for d in built.values()}) == len(PREFIX_TYPES)


@pytest.mark.parametrize("ptype", PREFIX_TYPES)
def test_prefix_structure(built, base, ptype):
    d = built[ptype]
    fmt = d.public_format
    assert fmt["kind"] == "canary_prefix" and fmt["type"] == ptype and fmt["l"] == 10 and fmt["k"] == 10
    assert fmt["n_references"] == 256 and fmt["separator"] == " "
    token_set = fmt["token_set"]
    assert len(token_set) == 10 and len(set(token_set)) == 10
    carriers = {r.id: r.text for r in base.targets}
    assert len({t.id for t in d.targets}) == len(d.targets)
    assert len({t.text for t in d.targets}) == len(d.targets)
    assert set(d.target_meta) == {t.id for t in d.targets}
    for rec in d.targets:
        m = d.target_meta[rec.id]
        assert m["type"] == ptype
        assert rec.text == m["prefix"] + " " + m["carrier"]
        assert m["carrier"] == carriers[m["carrier_id"]]
        toks = prefix_tokens(d, m["prefix"])
        assert len(toks) == 10 and set(toks) <= set(token_set)
        assert split_canary(fmt, rec.text) == (m["prefix"], m["carrier"])
    # tokens are drawn with replacement, so some prefix repeats a token; all k tokens are used somewhere
    used = Counter(t for r in d.targets for t in prefix_tokens(d, d.target_meta[r.id]["prefix"]))
    assert set(used) == set(token_set)
    assert any(len(set(prefix_tokens(d, d.target_meta[r.id]["prefix"]))) < 10 for r in d.targets)


def test_invisible_prefixes_are_invisible(built):
    d = built["invisible"]
    for ch in d.public_format["token_set"]:
        assert len(ch) == 1 and unicodedata.category(ch) == "Cf"
        assert not ch.isprintable() and not ch.isspace()
    for rec in d.targets:
        prefix = d.target_meta[rec.id]["prefix"]
        assert len(prefix) == 10
        assert all(unicodedata.category(c) == "Cf" for c in prefix)
        assert rec.text[10] == " "


def test_word_tokens_are_words(built, base):
    vocab = count_words(base.pretrain)
    for t in ("random", "rare", "common"):
        for w in built[t].public_format["token_set"]:
            assert re.fullmatch(r"[A-Za-z]+", w), (t, w)
    assert set(built["random"].public_format["token_set"]) <= set(vocab)


def test_common_and_rare_by_adaptation_frequency(built, base):
    # Marek et al. 2026, appendix B.5: frequencies are counted in the adaptation dataset
    # (here background + carrier pool)
    counts = count_words(list(base.adapt) + [r.text for r in base.targets])
    common, rare = built["common"].public_format["token_set"], built["rare"].public_format["token_set"]
    others = set(counts) - set(common)
    assert min(counts[w] for w in common) >= max(counts[w] for w in others)
    assert max(counts[w] for w in rare) == min(counts.values())
    assert max(counts[w] for w in rare) < min(counts[w] for w in common)


def test_rare_is_rarer_than_common_in_pretraining(cache, base):
    rare = Canaries(prefix_type="rare", frequency_source="pretrain", max_chars_per_source=BUDGET).build(cache)
    common = Canaries(prefix_type="common", frequency_source="pretrain", max_chars_per_source=BUDGET).build(cache)
    counts = count_words(base.pretrain)
    r, c = rare.public_format["token_set"], common.public_format["token_set"]
    assert all(counts[w] >= 1 for w in r)
    assert max(counts[w] for w in r) == min(counts.values()) == 1
    assert max(counts[w] for w in r) < min(counts[w] for w in c)
    assert c == [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]


def test_determinism_and_seed(cache, built):
    for t in PREFIX_TYPES:
        again = Canaries(prefix_type=t, max_chars_per_source=BUDGET).build(cache)
        assert again == built[t]
    for t in ("random", "invisible"):
        other = Canaries(prefix_type=t, seed=1, max_chars_per_source=BUDGET).build(cache)
        assert other.public_format["token_set"] != built[t].public_format["token_set"]
        assert other.fingerprint != built[t].fingerprint
    other = Canaries(prefix_type="common", seed=1, max_chars_per_source=BUDGET).build(cache)
    assert other.public_format["token_set"] == built["common"].public_format["token_set"]  # no randomness in C
    assert [r.text for r in other.targets] != [r.text for r in built["common"].targets]
    assert other.fingerprint != built["common"].fingerprint


def test_carrier_source_adapt(cache, base):
    d = Canaries(carrier_source="adapt", max_chars_per_source=BUDGET).build(cache)
    carriers = [d.target_meta[r.id]["carrier"] for r in d.targets]
    half = len(base.adapt) // 2
    assert carriers == list(base.adapt[:half])
    assert d.adapt == base.adapt[half:]
    assert not set(carriers) & set(d.adapt)


@pytest.mark.parametrize("ptype", PREFIX_TYPES)
def test_references(built, ptype):
    d = built[ptype]
    fmt = d.public_format
    for rec in d.targets[:5]:
        m = d.target_meta[rec.id]
        refs = references_for(fmt, rec.text)
        assert len(refs) == 256 and len(set(refs)) == 256
        assert rec.text not in refs
        for ref in refs:
            prefix, carrier = split_canary(fmt, ref)
            assert carrier == m["carrier"] and prefix != m["prefix"]
            toks = prefix_tokens(d, prefix)
            assert len(toks) == 10 and set(toks) <= set(fmt["token_set"])
        assert references_for(fmt, rec.text) == refs                      # deterministic
        assert references_for(fmt, rec.text, seed=1) != refs              # seeded
        assert references_for(fmt, rec.text, n=7) == references_for(fmt, rec.text, n=7)
        assert len(references_for(fmt, rec.text, n=7)) == 7


def test_generate_references_api(built):
    d = built["rare"]
    m = d.target_meta[d.targets[0].id]
    a = generate_references(d.public_format, m["carrier"], 50, np.random.default_rng(3), exclude=[m["prefix"]])
    b = generate_references(d.public_format, m["carrier"], 50, np.random.default_rng(3), exclude=[m["prefix"]])
    assert a == b and len(set(a)) == 50 and all(r.endswith(" " + m["carrier"]) for r in a)
    assert d.targets[0].text not in a
    assert len(generate_references(d.public_format, "x", None, np.random.default_rng(0))) == 256


@pytest.mark.parametrize("ptype", PREFIX_TYPES)
def test_challenger_inserts_canaries(built, ptype):
    d = built[ptype]
    ch = Challenger(d, WORLD, seed=0)
    inserts = ch.pretraining_inserts()
    adapt = ch.adaptation_data().texts
    text = {r.id: r.text for r in d.targets}
    ids = all_ids(ch)
    assert len(ids) == 4 * WORLD["n_per_group"]
    for rid in ids:
        a, b = ch.group_of(rid)
        t = text[rid]
        assert t.startswith(d.target_meta[rid]["prefix"] + " ")
        assert (t in inserts) == bool(a)
        assert (t in adapt) == bool(b)
    assert len(adapt) == WORLD["adapt_background"] + 2 * WORLD["n_per_group"]


# ------------------------------------------------------------------------------- random-word canaries

WORD_RE = re.compile(r"^the secret words are ([a-z]+) ([a-z]+) ([a-z]+)$")


def test_random_words_format(words, base):
    fmt = words.public_format
    vocab = fmt["vocabulary"]
    assert fmt["kind"] == "random_words" and fmt["repeats"] == 3 and fmt["n_references"] == 256
    assert vocab == sorted(set(vocab)) and len(vocab) > 500
    assert all(re.fullmatch(r"[a-z]{3,}", w) for w in vocab)
    assert len(words.targets) == 200
    assert len({r.text for r in words.targets}) == 200 and len({r.id for r in words.targets}) == 200
    for rec in words.targets:
        m = WORD_RE.match(rec.text)
        assert m, rec.text
        meta = words.target_meta[rec.id]
        assert list(m.groups()) == meta["words"] and set(meta["words"]) <= set(vocab)
        assert meta["repeats"] == 3
    assert words.adapt == base.adapt and words.pretrain == base.pretrain and words.population == base.population
    assert words.relation == base.relation and words.unit == "record"


def test_random_words_determinism(cache, words):
    again = RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=200).build(cache)
    assert again == words
    other = RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=200, seed=1).build(cache)
    assert [r.text for r in other.targets] != [r.text for r in words.targets]
    assert other.fingerprint != words.fingerprint
    ten = RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=200, repeats=10).build(cache)
    assert ten.public_format["repeats"] == 10 and len(ten.targets) == 200  # never duplicated in the pool
    assert ten.fingerprint != words.fingerprint


def test_random_words_config():
    with pytest.raises(ConfigError):
        RandomWordCanaries(repeats=2)
    with pytest.raises(ConfigError):
        RandomWordCanaries(template="{w1} {w2}")
    with pytest.raises(ConfigError):
        RandomWordCanaries(template="{w1} {w2} {w3} {w4}")
    RandomWordCanaries(template="{w1} {w2} {w3}")  # Segal et al.'s bare form


def test_random_words_custom_template(cache):
    d = RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=50, template="{w1} {w2} {w3}").build(cache)
    assert all(re.fullmatch(r"[a-z]+ [a-z]+ [a-z]+", r.text) for r in d.targets)


def test_random_word_references(words):
    fmt = words.public_format
    for rec in words.targets[:5]:
        refs = random_word_references_for(fmt, rec.text)
        assert len(refs) == 256 and len(set(refs)) == 256 and rec.text not in refs
        assert all(WORD_RE.match(r) and set(WORD_RE.match(r).groups()) <= set(fmt["vocabulary"]) for r in refs)
        assert random_word_references_for(fmt, rec.text) == refs
        assert random_word_references_for(fmt, rec.text, seed=1) != refs
    a = generate_word_references(fmt, 20, np.random.default_rng(5))
    assert a == generate_word_references(fmt, 20, np.random.default_rng(5)) and len(set(a)) == 20


def test_random_words_challenger(words):
    ch = Challenger(words, WORLD, seed=0)
    inserts = ch.pretraining_inserts()
    adapt = Counter(ch.adaptation_data().texts)
    text = {r.id: r.text for r in words.targets}
    for rid in all_ids(ch):
        a, b = ch.group_of(rid)
        assert (text[rid] in inserts) == bool(a)
        assert (adapt[text[rid]] > 0) == bool(b)


def _world_param(name):
    return next((p for p in WORLD_PARAMS if p.name == name), None)


def test_random_words_repeated_in_adaptation_explicit(cache):
    assert _world_param("adapt_target_repeats") is not None  # the world can repeat b = 1 targets in D
    for r in (1, 3, 10):
        d = RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=50, repeats=r).build(cache)
        ch = Challenger(d, {**WORLD, "adapt_target_repeats": d.public_format["repeats"]}, seed=0)
        adapt = Counter(ch.adaptation_data().texts)
        text = {x.id: x.text for x in d.targets}
        for rid in all_ids(ch):
            assert adapt[text[rid]] == (r if ch.group_of(rid)[1] else 0)


def test_random_words_repeated_in_adaptation_by_task(cache):
    assert _world_param("adapt_target_repeats").default is None  # null: the task's own repeats
    for r in (1, 3, 10):
        d = RandomWordCanaries(max_chars_per_source=BUDGET, n_canaries=50, repeats=r).build(cache)
        ch = Challenger(d, WORLD, seed=0)
        adapt = Counter(ch.adaptation_data().texts)
        text = {x.id: x.text for x in d.targets}
        for rid in all_ids(ch):
            assert adapt[text[rid]] == (r if ch.group_of(rid)[1] else 0)
