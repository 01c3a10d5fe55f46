"""Tests for tasks.names2ids: the synthetic Names2IDs directory of Segal et al. 2025."""

from __future__ import annotations

import re

import pytest

from bench.errors import ConfigError
from bench.game import GAMES, Challenger
from bench.registry import TASKS
from tasks.mini_pile import MiniPile
from tasks.names2ids import Names2IDs, to_ascii

BUDGET = 300_000
WORLD = {"n_per_group": 20, "n_null": 40, "adapt_background": 100}
RECORD = re.compile(r"^Name: ([A-Za-z][A-Za-z .'\-]*[A-Za-z.]), ID: ([1-9][0-9]{9})$")


@pytest.fixture(scope="module")
def base(cache):
    return MiniPile(max_chars_per_source=BUDGET).build(cache)


@pytest.fixture(scope="module")
def data(cache):
    return Names2IDs(max_chars_per_source=BUDGET).build(cache)


def people_records(data, base) -> list[str]:
    return [t for t in data.population if t not in set(base.population)]


def test_registered_and_params():
    assert TASKS.get("names2ids") is Names2IDs
    names = {p.name for p in Names2IDs.params}
    assert {"n_people", "locales", "seed", "max_chars_per_source"} <= names
    with pytest.raises(ConfigError):
        Names2IDs(locales=[])
    with pytest.raises(ConfigError):
        Names2IDs(locales=["xx_XX"])
    with pytest.raises(ConfigError):
        Names2IDs(locales=["en_US", "en_US"])


def test_sizes_and_partitions(data, base):
    assert data.name == "names2ids" and data.relation == "ood" and data.unit == "record"
    assert data.pretrain == base.pretrain and data.heldout == base.heldout
    assert (len(data.targets), len(data.adapt)) == (1000, 500)
    pop_people = people_records(data, base)
    assert len(pop_people) == 500 and len(data.population) == len(base.population) + 500
    assert set(base.population) <= set(data.population)
    assert data.stats["people"]["by_locale"] and sum(data.stats["people"]["by_locale"].values()) == 2000
    assert data.public_format == {"kind": "pii", "template": "Name: {name}, ID: {id}", "prompt": "Name: {name}, ID:",
                                  "id_digits": 10}


def test_format_and_uniqueness(data, base):
    records = [r.text for r in data.targets] + list(data.adapt) + people_records(data, base)
    assert len(records) == 2000
    names, ids = [], []
    for text in records:
        m = RECORD.match(text)
        assert m, text
        assert len(text) <= 60 and text.isascii()
        names.append(m.group(1))
        ids.append(m.group(2))
    assert len(set(names)) == len(names) and len({n.casefold() for n in names}) == len(names)
    assert len(set(ids)) == len(ids)
    assert len({r.id for r in data.targets}) == len(data.targets)


def test_target_meta(data):
    assert set(data.target_meta) == {r.id for r in data.targets}
    for rec in data.targets:
        m = data.target_meta[rec.id]
        assert rec.text == f"Name: {m['name']}, ID: {m['id']}"
        assert data.public_format["template"].format(name=m["name"], id=m["id"]) == rec.text
        assert rec.text.startswith(data.public_format["prompt"].format(name=m["name"]))


def test_target_ids_appear_nowhere_else(data):
    others = "\n".join(list(data.adapt) + list(data.population) + list(data.heldout) + list(data.pretrain))
    targets = "\n".join(r.text for r in data.targets)
    for rec in data.targets:
        m = data.target_meta[rec.id]
        assert m["id"] not in others
        assert f"Name: {m['name']}," not in others
        # the meta leaks into no target text but its own record
        assert targets.count(m["id"]) == 1
        assert targets.count(f"Name: {m['name']}, ID:") == 1


def test_determinism_and_seed(cache, data):
    again = Names2IDs(max_chars_per_source=BUDGET).build(cache)
    assert again == data
    other = Names2IDs(max_chars_per_source=BUDGET, seed=1).build(cache)
    assert other.fingerprint != data.fingerprint
    assert {r.text for r in other.targets} != {r.text for r in data.targets}
    assert {m["id"] for m in other.target_meta.values()} != {m["id"] for m in data.target_meta.values()}


def test_locales_and_ascii(cache):
    d = Names2IDs(max_chars_per_source=BUDGET, n_people=120, locales=["pl_PL"], ascii_names=False).build(cache)
    assert {m["locale"] for m in d.target_meta.values()} == {"pl_PL"}
    assert any(not r.text.isascii() for r in d.targets)
    assert len(d.targets) + len(d.adapt) == 120 - round(0.25 * 120)
    assert to_ascii("Łukasz Zięcik") == "Lukasz Ziecik"
    assert to_ascii("Grégoire Straße") == "Gregoire Strasse"


def test_records_are_short_in_bpe_tokens(data, base, tmp_path):
    pytest.importorskip("tokenizers")
    from bench.tokenizer import train_bpe_tokenizer
    from tokenizers import Tokenizer
    train_bpe_tokenizer(base.pretrain, tmp_path, vocab_size=8192)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    lengths = [len(e.ids) for e in tok.encode_batch([r.text for r in data.targets] + list(data.adapt))]
    assert max(lengths) < 40, max(lengths)


def test_challenger(data):
    ch = Challenger(data, WORLD, seed=0)
    inserts = ch.pretraining_inserts()
    adapt = ch.adaptation_data().texts
    text = {r.id: r.text for r in data.targets}
    ids = list(ch.instance(GAMES["pretrain"]).record_ids)
    assert len(ids) == 4 * WORLD["n_per_group"]  # the four groups; the null pool is shown by no other game
    for rid in ids:
        a, b = ch.group_of(rid)
        assert (text[rid] in inserts) == bool(a)
        assert (text[rid] in adapt) == bool(b)
    # the adaptation data is a directory: background people plus the b = 1 targets
    assert len(adapt) == WORLD["adapt_background"] + 2 * WORLD["n_per_group"]
    assert all(RECORD.match(t) for t in adapt)
