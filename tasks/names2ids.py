"""Names2IDs: synthetic people, each a name paired with a 10-digit ID (Segal et al. 2025, sections 5
and 5.2).

Segal et al. use "Names2IDs (synthetic names paired with 10-digit IDs)" to simulate PII extraction: given
the prompt ``"Name: <name>, ID:"`` the adversary decodes the ID token by token (average extracted
length, full extraction rate). A record is therefore ``"Name: <name>, ID: <id>"``.

* Names come from Faker in several locales (round robin over ``locales``; one Faker instance per locale,
  seeded with ``seed_instance``), as ``first_name() + " " + last_name()``. With ``ascii_names``
  (default) they are transliterated to ASCII (accents dropped, ł → l, ß → ss, ...) so that the tiny
  byte-level BPE models see short records; names are unique (case-insensitively) and every record has at
  most ``MAX_RECORD_CHARS`` characters (Segal et al.: at most 25 LLaMA tokens).
* IDs are 10-digit numbers with a non-zero first digit from a seeded numpy Generator, unique, and
  never a 10-digit run of any mini_pile text (so no ID is in any partition by accident).
* Partitions: pretrain is mini_pile's; held-out is mini_pile's, or with ``heldout_fraction`` the records of
  further people nobody trains on (utility on the adaptation domain); the adaptation background is other people
  ("learn this directory"); the target pool is people whose membership the game's bits decide;
  the attacker-owned population is mini_pile's population plus further people (disjoint from
  everyone else), shuffled together.
* The attacker knows the names (they are in the target texts) and the format, not the IDs:
  ``public_format`` carries the template and the extraction prompt.

The relation of the adaptation data to pretraining is ``ood`` (a synthetic directory next to code
and plays). Segal et al. do not list their locales; the default six are a choice of this benchmark. The
Faker version is recorded in ``sources`` (names differ between Faker versions; the fingerprint is
content-based, so such a change is never confused with the old data).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bench.errors import ConfigError, DataError
from bench.hashing import content_hash
from bench.params import Param
from bench.registry import register_task
from tasks.derived import derived_fingerprint, partition_stats
from bench.task import TargetRecord, Task, TaskData
from tasks.mini_pile import MiniPile, OnMiniPile

__all__ = ["TEMPLATE", "PROMPT", "ID_DIGITS", "MAX_RECORD_CHARS", "to_ascii", "format_record",
           "make_people", "Names2IDs"]

TEMPLATE = "Name: {name}, ID: {id}"
PROMPT = "Name: {name}, ID:"
ID_DIGITS = 10
MAX_RECORD_CHARS = 60
DEFAULT_LOCALES = ["en_US", "de_DE", "fr_FR", "es_ES", "it_IT", "pl_PL"]

# Letters NFKD does not decompose into ASCII.
_TRANSLIT = str.maketrans({"ł": "l", "Ł": "L", "ß": "ss", "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe",
                           "Œ": "OE", "đ": "d", "Đ": "D", "ı": "i", "þ": "th", "Þ": "Th", "ð": "d", "Ð": "D"})
_DIGIT_RUN = re.compile(r"\d{%d,}" % ID_DIGITS)


def to_ascii(name: str) -> str:
    """ASCII transliteration: special letters mapped, accents dropped (NFKD without combining marks)."""
    decomposed = unicodedata.normalize("NFKD", name.translate(_TRANSLIT))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def format_record(name: str, pid: str) -> str:
    return TEMPLATE.format(name=name, id=pid)


def _seed_int(*parts: Any) -> int:
    return int(content_hash("privbench-names2ids", *parts, length=16), 16)


def _corpus_ids(texts) -> set[str]:
    """Every 10-digit window of every digit run in ``texts``."""
    out: set[str] = set()
    for t in texts:
        for m in _DIGIT_RUN.finditer(t):
            run = m.group()
            out.update(run[i:i + ID_DIGITS] for i in range(len(run) - ID_DIGITS + 1))
    return out


def seeded_fakers(locales: Sequence[str], seed_of: Callable[[str], int], *, task: str) -> list[tuple[str, Any]]:
    """One Faker per locale, each seeded with ``seed_of(locale)``; clear errors for a missing package or locale."""
    try:
        from faker import Faker
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DataError(f"the {task} task needs the 'faker' package: pip install faker") from exc
    fakers = []
    for loc in locales:
        try:
            f = Faker(loc)
        except AttributeError as exc:
            raise ConfigError(f"{task}: Faker knows no locale {loc!r}: use e.g. {', '.join(DEFAULT_LOCALES)}"
                              ) from exc
        f.seed_instance(seed_of(loc))
        fakers.append((loc, f))
    return fakers


def make_people(n: int, locales: list[str], seed: int, *, ascii_names: bool = True,
                forbidden_ids: set[str] | frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """``n`` people ``{"name", "id", "locale"}`` with unique names and unique IDs, deterministic in ``seed``."""
    fakers = seeded_fakers(locales, lambda loc: _seed_int("names", seed, loc), task="names2ids")
    people: list[dict[str, str]] = []
    seen_names: set[str] = set()
    misses, max_misses = 0, 50 * n + 1000
    i = 0
    while len(people) < n:
        loc, f = fakers[i % len(fakers)]
        i += 1
        name = " ".join(f"{f.first_name()} {f.last_name()}".split())
        if ascii_names:
            name = to_ascii(name)
        key = name.casefold()
        if (not name or key in seen_names or len(format_record(name, "0" * ID_DIGITS)) > MAX_RECORD_CHARS
                or (ascii_names and not name.isascii()) or "," in name):
            misses += 1
            if misses > max_misses:
                raise DataError(f"names2ids: could not draw {n} unique names from locales {locales}: "
                                f"lower n_people or add locales")
            continue
        seen_names.add(key)
        people.append({"name": name, "locale": loc})
    rng = np.random.default_rng(_seed_int("ids", seed))
    ids: list[str] = []
    seen_ids: set[str] = set()
    while len(ids) < n:
        for v in rng.integers(10 ** (ID_DIGITS - 1), 10 ** ID_DIGITS, size=n - len(ids)).tolist():
            s = str(v)
            if s not in seen_ids and s not in forbidden_ids:
                seen_ids.add(s)
                ids.append(s)
    for p, pid in zip(people, ids):
        p["id"] = pid
    return people


@register_task("names2ids")
class Names2IDs(OnMiniPile, Task):
    offline = True
    record_unit = "'Name: <name>, ID: <10 digits>'"
    extra_licenses = ("synthetic (Faker names, MIT)",)

    def relation_label(self) -> str:
        return "ood"  # a synthetic directory next to whatever the model was pretrained on

    description = ("Names2IDs (Segal et al. 2025): synthetic people 'Name: <name>, ID: <10 digits>' from Faker in "
                   "several locales; adaptation learns a directory, targets are further people; mini_pile for "
                   "pretraining.")
    version = "0.2.0"
    params = (
        Param("n_people", int, 2000, "synthetic people in all (targets + adaptation background + population)",
              low=16),
        Param("adapt_fraction", float, 0.25, "share of the people in the adaptation background", low=0.0, high=0.9),
        Param("population_fraction", float, 0.25, "share of the people owned by the attacker (population)",
              low=0.0, high=0.9),
        Param("heldout_fraction", float, 0.0, "share of the people whose records are the held-out utility split "
              "(the adaptation domain itself); 0 = mini_pile's held-out records", low=0.0, high=0.5),
        Param("locales", list, DEFAULT_LOCALES, "Faker locales the names are drawn from (round robin)",
              item_type=str),
        Param("ascii_names", bool, True, "transliterate names to ASCII (short records for the tiny models)"),
        Param("seed", int, 0, "seed of the names (Faker.seed_instance) and of the IDs (numpy)"),
    ) + MiniPile.params

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if not self.locales:
            raise ConfigError("task 'names2ids': locales is empty: name at least one Faker locale, e.g. en_US")
        try:
            from faker.config import AVAILABLE_LOCALES
        except ImportError:  # pragma: no cover - build() says what to install
            AVAILABLE_LOCALES = None
        unknown = [loc for loc in self.locales if AVAILABLE_LOCALES is not None and loc not in AVAILABLE_LOCALES]
        if unknown:
            raise ConfigError(f"task 'names2ids': Faker knows no locale {', '.join(map(repr, unknown))}: "
                              f"use e.g. {', '.join(DEFAULT_LOCALES)}")
        if len(set(self.locales)) != len(self.locales):
            raise ConfigError("task 'names2ids': locales lists a locale twice: name each once")
        if self.adapt_fraction + self.population_fraction + self.heldout_fraction >= 0.95:
            raise ConfigError("task 'names2ids': adapt_fraction + population_fraction + heldout_fraction must leave "
                              "at least 5 % of the people as targets")

    def build(self, cache=None) -> TaskData:
        import faker

        base = MiniPile(**{p.name: self.config[p.name] for p in MiniPile.params}).build(cache)
        forbidden = _corpus_ids(base.pretrain + base.heldout + base.population + base.adapt
                                + tuple(r.text for r in base.targets))
        people = make_people(self.n_people, list(self.locales), self.seed, ascii_names=self.ascii_names,
                             forbidden_ids=forbidden)
        order = np.random.default_rng(_seed_int("roles", self.seed)).permutation(len(people)).tolist()
        n_adapt = int(round(self.adapt_fraction * len(people)))
        n_pop = int(round(self.population_fraction * len(people)))
        n_held = int(round(self.heldout_fraction * len(people)))
        adapt_people = [people[i] for i in order[:n_adapt]]
        pop_people = [people[i] for i in order[n_adapt:n_adapt + n_pop]]
        held_people = [people[i] for i in order[n_adapt + n_pop:n_adapt + n_pop + n_held]]
        target_people = [people[i] for i in order[n_adapt + n_pop + n_held:]]
        # utility on the adaptation domain: records of people nobody trains on (else mini_pile's held-out text)
        heldout = tuple(format_record(p["name"], p["id"]) for p in held_people) if held_people else base.heldout

        adapt = tuple(format_record(p["name"], p["id"]) for p in adapt_people)
        population = list(base.population) + [format_record(p["name"], p["id"]) for p in pop_people]
        mix = np.random.default_rng(_seed_int("population", self.seed)).permutation(len(population)).tolist()
        population = tuple(population[i] for i in mix)
        targets, meta = [], {}
        for p in target_people:
            text = format_record(p["name"], p["id"])
            rid = f"n2i-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"
            targets.append(TargetRecord(rid, text))
            meta[rid] = {"name": p["name"], "id": p["id"], "locale": p["locale"]}
        public_format = {"kind": "pii", "template": TEMPLATE, "prompt": PROMPT, "id_digits": ID_DIGITS}

        fingerprint = derived_fingerprint({"name": self.name, "config": self.config, "base": base.fingerprint,
                                           "public_format": public_format, "faker": faker.VERSION,
                                           "heldout": content_hash(list(heldout))},
                                          targets, adapt, population)
        synthetic = {"name": "names2ids", "kind": "pii", "version": faker.VERSION,
                     "description": f"synthetic 'Name: <name>, ID: <10 digits>' records, Faker locales "
                                    f"{', '.join(self.locales)}, seed {self.seed}",
                     "provenance": f"generated by privbench (Faker {faker.VERSION} names, numpy IDs)",
                     "license": "synthetic; Faker MIT"}
        stats = partition_stats(pretrain=base.pretrain, heldout=heldout, population=population, adapt=adapt,
                                targets=[t.text for t in targets])
        stats["people"] = {"targets": len(target_people), "adapt": len(adapt_people), "population": len(pop_people),
                           "heldout": len(held_people),
                           "max_record_chars": max(len(format_record(p["name"], p["id"])) for p in people),
                           "by_locale": {loc: sum(p["locale"] == loc for p in people) for loc in self.locales}}
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=heldout, population=population, adapt=adapt,
            targets=tuple(targets), fingerprint=fingerprint, sources=tuple(base.sources) + (synthetic,),
            stats=stats, relation="ood", unit="record", target_meta=meta, public_format=public_format,
        )
