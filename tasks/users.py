"""Synthetic users: a user-stratified corpus for user inference (Kandpal et al. 2024), built on
mini_pile.

User inference (Kandpal et al. 2024) asks whether *any* of a user's documents were in the fine-tuning data,
given a few other samples of that user. It works because a user's documents share a user-specific
distribution (Enron: "identifying information such as names (in salutations and signatures)"), and it
gets stronger with the amount of data per user and with shared features such as "an email signature
or short characteristic phrase". This task builds such users from real text.

Users
-----
Each user has

* a Faker identity in one of ``locales`` (round robin): name, a city of that locale, a job
  (ASCII-transliterated by default, like ``names2ids``; names are unique);
* a *writing style* fixed for all their documents: a greeting (some address a fixed colleague by
  first name), a sign-off, a signature layout showing name / job / city, and two recurring personal
  phrases (Faker ``catch_phrase`` / ``bs``) in a fixed phrase template; each document carries one of
  the two phrases;
* a *topic*: the bodies of a user's documents are real mini_pile records (Python stdlib code or
  Shakespeare) from a user-specific neighbourhood of the corpus: every user gets a random seed record
  and then, round robin over users, each takes the unassigned record most similar to its seed
  (cosine of hashed, idf-weighted bags of words). A user therefore writes about one module's code or
  one play's characters, and no record is used twice.

A document is ``greeting / body / phrase / sign-off / signature``, separated by blank lines.
Everything but the body is user-specific and repeats over the user's documents, so a model
fine-tuned on a user lowers its loss on *that user's other documents* (Kandpal et al.'s
user-level overfitting); the bodies add topic-level regularity without being shared verbatim.

Documents per user follow a realistic, skewed spread: log-normal (median ``docs_median``, spread
``docs_sigma``) or Zipf (exponent ``zipf_a``), shifted/clipped into ``[min_docs, max_docs]``.

Roles and partitions
--------------------
Users are split into *target* users (whose membership the challenger decides), *adaptation
background* users (their documents are the adaptation data D, "other customers") and *population*
users (attacker-owned, from the same distribution; their documents are appended to mini_pile's
population). Target and background bodies come from mini_pile's target and adaptation records,
population bodies from mini_pile's population records (attacker-owned text stays attacker-owned;
unused population records stay in the population); pretrain and heldout are mini_pile's, so no
body is ever in pretraining.

Attacker knowledge (Kandpal et al. 2024: "we set aside 10% of a user's samples as the attacker's knowledge; these
samples are never used for fine-tuning"): for every target and adaptation user, ``max(1, round(attacker_fraction
× n_docs))`` documents (at most n_docs - 1) are set aside. They are NOT targets and NOT adaptation
data; they are public, in ``public_format["user_samples"][user_id]``. A world pools the two partitions' users and
draws its target users and D's background users from that pool under its own salt
(:func:`bench.pools.split_user_pool`), so the task's roles below are only where a user's documents start.
``TaskData.targets`` are the target partition's users' remaining documents, each with
``target_meta[id]["user"] = user_id`` (challenger-side).
``unit = "user"``: the challenger puts all records of a user in one (a, b) group and counts world
sizes in users (:func:`group_targets_by_unit`). The user id is an opaque hash, drawn before any
membership exists, so it says nothing about membership; a user-level game shows one target per user,
with the attacker's samples of that user as its ``Target.samples`` (:mod:`bench.units`). The owner of
every adaptation record is ``TaskData.adapt_owners`` (challenger-only; a defense receives per-world
pseudonyms of owners in ``AdaptationData.users``).

Canary users (Kandpal et al. 2024, section 4.3 and Algorithm 1): ``canary_users`` target users, drawn uniformly,
get a shared substring: one of their documents is drawn uniformly among those whose body has at
least ``canary_length`` words, a contiguous run of ``canary_length`` whitespace-separated words is
drawn from its body (whitespace collapsed to single spaces), and the run is inserted at a uniformly
drawn word boundary of the body of *every* document of the user (attacker samples included, as they
are that user's data too). Deviations: "token" is a whitespace word (the models' BPE is trained per
world); the run is drawn from the body, not from greeting or signature (which repeat anyway); a user
qualifies only if one of its bodies has enough words (else a DataError names the fix).
``target_meta`` marks canaries (``canary``, ``canary_substring``); the attacker is not told which users
are canaries.

Relation: ``ood`` — the adaptation data is mail-like framing around non-member mini_pile text.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.errors import ConfigError, DataError
from bench.hashing import content_hash
from bench.params import Param
from bench.registry import register_task
from tasks.derived import derived_fingerprint, partition_stats
from bench.task import TargetRecord, Task, TaskData
# the unit draw lives in the game core; re-exported here for code that imported it from this module
from bench.units import UNIT_META_KEYS, draw_unit_groups, group_targets_by_unit, unit_key
from tasks.mini_pile import MiniPile, OnMiniPile
from tasks.names2ids import DEFAULT_LOCALES, seeded_fakers, to_ascii

__all__ = ["UNIT_META_KEYS", "unit_key", "group_targets_by_unit", "draw_unit_groups", "draw_doc_counts", "assign_topics",
           "insert_at_word_boundary", "SyntheticUsers"]


GREETINGS = ("Hi {to},", "Dear {to},", "Hello {to},", "Hey {to}!", "Good morning {to},", "Hi all,",
             "Hello team,", "Dear colleagues,", "Greetings,", "Morning folks,")
SIGNOFFS = ("Best,", "Cheers,", "Regards,", "Kind regards,", "Thanks,", "All the best,", "Best wishes,",
            "Warmly,", "Thank you,", "Speak soon,")
PHRASE_TEMPLATES = ("As I always say: {p}.", "P.S. {p}.", "Remember: {p}.", "Bottom line: {p}.",
                    "Note to self: {p}.", "My motto: {p}.")
SIGNATURES = ("{name}\n{job}, {city}", "{name} | {job} | {city}", "-- {name} ({job}, {city})",
              "{name}\n{city}", "{name}, {job}")
MAX_JOB_CHARS = 40

_TOPIC_WORD = re.compile(r"[a-z_][a-z0-9_]{2,}")
_TOPIC_DIM = 1 << 15


# ---------------------------------------------------------------------------------------- helpers

def _seed_int(*parts: Any) -> int:
    return int(content_hash("privbench-users", *parts, length=16), 16)


def _rng(*parts: Any) -> np.random.Generator:
    return np.random.default_rng(_seed_int(*parts))


def draw_doc_counts(n: int, rng: np.random.Generator, *, distribution: str, median: float, sigma: float,
                    zipf_a: float, min_docs: int, max_docs: int) -> list[int]:
    """Documents per user: log-normal (median, sigma) rounded, or min_docs - 1 + Zipf(zipf_a); clipped."""
    if distribution == "lognormal":
        raw = np.rint(rng.lognormal(math.log(median), sigma, size=n))
    elif distribution == "zipf":
        raw = (min_docs - 1) + rng.zipf(zipf_a, size=n).astype(np.float64)
    else:
        raise ConfigError(f"unknown docs_distribution {distribution!r}: use lognormal or zipf")
    return np.clip(raw, min_docs, max_docs).astype(np.int64).tolist()


def _topic_vectors(texts: Sequence[str]):
    """Rows: L2-normalised idf-weighted log(1 + tf) bags of hashed words (scipy CSR)."""
    from scipy.sparse import csr_matrix

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, t in enumerate(texts):
        for w, c in Counter(_TOPIC_WORD.findall(t.lower())).items():
            rows.append(i)
            cols.append(zlib.crc32(w.encode("utf-8")) % _TOPIC_DIM)
            vals.append(float(c))
    x = csr_matrix((vals, (rows, cols)), shape=(len(texts), _TOPIC_DIM), dtype=np.float64)
    x.sum_duplicates()
    x.data = np.log1p(x.data)
    df = np.bincount(x.indices, minlength=_TOPIC_DIM)
    idf = np.log((1.0 + len(texts)) / (1.0 + df)) + 1.0
    x.data *= idf[x.indices]
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    x = csr_matrix(x.multiply(1.0 / norms[:, None]))
    return x


def assign_topics(texts: Sequence[str], quotas: Sequence[int], rng: np.random.Generator) -> list[list[int]]:
    """Give user ``u`` ``quotas[u]`` distinct indices into ``texts``: its seed, then round robin its nearest.

    Seeds are drawn uniformly without replacement; then, in rounds over the users still short of their
    quota (in user order), each takes the unassigned text most similar to its seed (ties: lower index).
    """
    need = int(sum(quotas))
    if need > len(texts):
        raise DataError(f"{len(quotas)} users need {need} documents but only {len(texts)} records are available")
    if not quotas:
        return []
    x = _topic_vectors(texts)
    seeds = rng.choice(len(texts), size=len(quotas), replace=False)
    sims = (x @ x[seeds].T).toarray().astype(np.float32)
    taken = np.zeros(len(texts), dtype=bool)
    out: list[list[int]] = [[int(s)] for s in seeds]
    taken[seeds] = True
    order = [np.argsort(-sims[:, u], kind="stable") for u in range(len(quotas))]
    ptr = [0] * len(quotas)
    active = [u for u in range(len(quotas)) if quotas[u] > 1]
    while active:
        nxt = []
        for u in active:
            lst, p = order[u], ptr[u]
            while taken[lst[p]]:
                p += 1
            i = int(lst[p])
            taken[i] = True
            out[u].append(i)
            ptr[u] = p + 1
            if len(out[u]) < quotas[u]:
                nxt.append(u)
        active = nxt
    return out


def insert_at_word_boundary(body: str, insert: str, rng: np.random.Generator) -> str:
    """``insert`` placed at a uniformly drawn word boundary of ``body`` (start, end or before a whitespace run)."""
    gaps = [m.start() for m in re.finditer(r"\s+", body)]
    choices = [0] + gaps + [len(body)]
    pos = choices[int(rng.integers(0, len(choices)))]
    if pos == 0:
        return insert + " " + body
    if pos == len(body):
        return body + " " + insert
    return body[:pos] + " " + insert + body[pos:]


def _clean(s: str, ascii_only: bool) -> str:
    s = " ".join(s.split())
    return to_ascii(s) if ascii_only else s


def _short_job(f, ascii_only: bool) -> str:
    job = ""
    for _ in range(6):
        job = _clean(f.job(), ascii_only)
        if len(job) <= MAX_JOB_CHARS:
            return job
    return job[:MAX_JOB_CHARS].rsplit(" ", 1)[0]


def _city(f, ascii_only: bool) -> str:
    """Faker's city, independent of Python's hash seed: a locale whose city list Faker builds from a set
    (it_IT: ``list({...})``) has an order that changes from process to process, so ``f.city()`` would draw a
    different city for the same seed; such a list is sorted before the (same, seeded) draw."""
    cities = getattr(f.provider("faker.providers.address"), "cities", None)
    if isinstance(cities, list) and cities:  # tuples are literals in Faker's source: already ordered
        return _clean(f.random_element(sorted(set(cities))), ascii_only)
    return _clean(f.city(), ascii_only)


def make_identities(n: int, locales: Sequence[str], seed: int, *, ascii_only: bool = True) -> list[dict[str, Any]]:
    """``n`` users with unique names: identity (Faker, round robin over ``locales``) and a fixed style."""
    from faker import Faker

    fakers = seeded_fakers(locales, lambda loc: _seed_int("identity", seed, loc), task="synthetic_users")
    phrases = Faker("en_US")
    phrases.seed_instance(_seed_int("phrases", seed))
    users: list[dict[str, Any]] = []
    seen: set[str] = set()
    misses, i = 0, 0
    while len(users) < n:
        loc, f = fakers[i % len(fakers)]
        i += 1
        name = _clean(f"{f.first_name()} {f.last_name()}", ascii_only)
        if not name or name.casefold() in seen or (ascii_only and not name.isascii()):
            misses += 1
            if misses > 50 * n + 1000:
                raise DataError(f"synthetic_users: could not draw {n} unique names from locales {list(locales)}: "
                                f"lower n_users or add locales")
            continue
        seen.add(name.casefold())
        style = _rng("style", seed, name)
        users.append({
            "user": "u-" + content_hash("privbench-users", "user", seed, name, length=12),
            "name": name, "locale": loc, "city": _city(f, ascii_only), "job": _short_job(f, ascii_only),
            "to": _clean(f.first_name(), ascii_only),
            "greeting": GREETINGS[int(style.integers(len(GREETINGS)))],
            "signoff": SIGNOFFS[int(style.integers(len(SIGNOFFS)))],
            "signature": SIGNATURES[int(style.integers(len(SIGNATURES)))],
            "phrase_template": PHRASE_TEMPLATES[int(style.integers(len(PHRASE_TEMPLATES)))],
            "phrases": [" ".join(phrases.catch_phrase().lower().split()), " ".join(phrases.bs().split())],
        })
    return users


def _frame(user: dict[str, Any], body: str, phrase: str) -> str:
    return "\n\n".join((user["greeting"].format(to=user["to"]), body,
                        user["phrase_template"].format(p=phrase), user["signoff"] + "\n" +
                        user["signature"].format(name=user["name"], job=user["job"], city=user["city"])))


def _draw_canary(bodies: Sequence[str], length: int, rng: np.random.Generator) -> str | None:
    """A ``length``-word contiguous run of one body drawn uniformly among bodies long enough
    (Kandpal et al. 2024, Algorithm 1)."""
    long_enough = [b for b in bodies if len(b.split()) >= length]
    if not long_enough:
        return None
    words = long_enough[int(rng.integers(len(long_enough)))].split()
    start = int(rng.integers(0, len(words) - length + 1))
    return " ".join(words[start:start + length])


def _spread(counts: Sequence[int]) -> dict[str, Any]:
    if not counts:
        return {"n_users": 0}
    c = np.asarray(counts)
    return {"n_users": int(c.size), "n_docs": int(c.sum()), "min": int(c.min()), "max": int(c.max()),
            "mean": float(c.mean()), "median": float(np.median(c)), "distinct": int(np.unique(c).size)}


@register_task("synthetic_users")
class SyntheticUsers(OnMiniPile, Task):
    description = ("User-stratified corpus (Kandpal et al. 2024): Faker users with a fixed greeting, signature and "
                   "personal phrases writing about a user-specific topic (real mini_pile records); unit = user, 10% "
                   "of each user's documents are the attacker's samples; optional canary users sharing a "
                   "substring.")
    version = "0.3.0"  # 0.3.0: the adaptation users' set-aside samples are published too (the world's user draw)
    params = (
        Param("n_users", int, 300, "synthetic users in all (targets + adaptation background + population)", low=4),
        Param("adapt_fraction", float, 0.2, "share of the users whose documents are the adaptation background D",
              low=0.0, high=0.9),
        Param("population_fraction", float, 0.2, "share of the users owned by the attacker (population)",
              low=0.0, high=0.9),
        Param("docs_distribution", str, "lognormal", "documents per user: lognormal or zipf",
              choices=("lognormal", "zipf")),
        Param("docs_median", float, 6.0, "median documents per user (lognormal)", low=1.0),
        Param("docs_sigma", float, 0.6, "log-scale spread of documents per user (lognormal)", low=0.0),
        Param("zipf_a", float, 2.0, "Zipf exponent: documents = min_docs - 1 + Zipf(a)", low=1.0,
              low_inclusive=False),
        Param("min_docs", int, 3, "fewest documents of a user (>= 2: one for the attacker, one to train on)", low=2),
        Param("max_docs", int, 40, "most documents of a user", low=2),
        Param("attacker_fraction", float, 0.1, "share of each target user's documents set aside as the attacker's "
              "samples (Kandpal et al. 2024: 10%); at least one, and one stays a target", low=0.0, high=0.5,
              low_inclusive=False),
        Param("canary_users", int, 0, "target users whose documents all share an inserted substring "
              "(Kandpal et al. 2024, section 4.3)", low=0),
        Param("canary_length", int, 10, "words in the canary users' shared substring", low=1, high=100),
        Param("locales", list, DEFAULT_LOCALES, "Faker locales of the users (round robin)", item_type=str),
        Param("ascii_identity", bool, True, "transliterate names, cities and jobs to ASCII"),
        Param("seed", int, 0, "seed of identities, styles, documents per user, topics and canaries"),
    ) + MiniPile.params

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if not self.locales:
            raise ConfigError("task 'synthetic_users': locales is empty: name at least one Faker locale, e.g. en_US")
        if len(set(self.locales)) != len(self.locales):
            raise ConfigError("task 'synthetic_users': locales lists a locale twice: name each once")
        try:
            from faker.config import AVAILABLE_LOCALES
        except ImportError:  # pragma: no cover - build() says what to install
            AVAILABLE_LOCALES = None
        unknown = [loc for loc in self.locales if AVAILABLE_LOCALES is not None and loc not in AVAILABLE_LOCALES]
        if unknown:
            raise ConfigError(f"task 'synthetic_users': Faker knows no locale {', '.join(map(repr, unknown))}: "
                              f"use e.g. {', '.join(DEFAULT_LOCALES)}")
        if self.max_docs < self.min_docs:
            raise ConfigError(f"task 'synthetic_users': max_docs ({self.max_docs}) < min_docs ({self.min_docs}): "
                              f"raise max_docs")
        if self.adapt_fraction + self.population_fraction >= 0.95:
            raise ConfigError("task 'synthetic_users': adapt_fraction + population_fraction must leave at least 5 % "
                              "of the users as targets")
        n_target = self.n_users - self._n_role("adapt") - self._n_role("population")
        if self.canary_users > n_target:
            raise ConfigError(f"task 'synthetic_users': canary_users ({self.canary_users}) exceeds the "
                              f"{n_target} target users: lower canary_users or raise n_users")

    def _n_role(self, role: str) -> int:
        frac = self.adapt_fraction if role == "adapt" else self.population_fraction
        return int(round(frac * self.n_users))

    def build(self, cache=None) -> TaskData:
        import faker

        base = MiniPile(**{p.name: self.config[p.name] for p in MiniPile.params}).build(cache)
        users = make_identities(self.n_users, list(self.locales), self.seed, ascii_only=self.ascii_identity)
        counts = draw_doc_counts(self.n_users, _rng("counts", self.seed), distribution=self.docs_distribution,
                                 median=self.docs_median, sigma=self.docs_sigma, zipf_a=self.zipf_a,
                                 min_docs=self.min_docs, max_docs=self.max_docs)
        for u, c in zip(users, counts):
            u["n_docs"] = int(c)
        order = _rng("roles", self.seed).permutation(len(users)).tolist()
        n_adapt, n_pop = self._n_role("adapt"), self._n_role("population")
        adapt_users = [users[i] for i in order[:n_adapt]]
        pop_users = [users[i] for i in order[n_adapt:n_adapt + n_pop]]
        target_users = [users[i] for i in order[n_adapt + n_pop:]]

        # bodies: targets + background from mini_pile's target and adaptation records, population users from
        # mini_pile's population records
        private_pool = [r.text for r in base.targets] + list(base.adapt)
        private_users = target_users + adapt_users
        try:
            picks = assign_topics(private_pool, [u["n_docs"] for u in private_users], _rng("topics", self.seed))
            pop_picks = assign_topics(base.population, [u["n_docs"] for u in pop_users],
                                      _rng("population-topics", self.seed))
        except DataError as exc:
            raise DataError(f"task 'synthetic_users': {exc}: lower n_users or docs_median, or raise "
                            f"max_chars_per_source") from None
        for u, idx in zip(private_users, picks):
            u["bodies"] = [private_pool[i] for i in idx]
        used_pop = set()
        for u, idx in zip(pop_users, pop_picks):
            u["bodies"] = [base.population[i] for i in idx]
            used_pop.update(idx)

        # canary users (Kandpal et al. 2024, Algorithm 1): a shared run of canary_length words in every document's body
        crng = _rng("canaries", self.seed, self.canary_length)
        eligible = [u for u in target_users if any(len(b.split()) >= self.canary_length for b in u["bodies"])]
        if len(eligible) < self.canary_users:
            raise DataError(f"task 'synthetic_users': only {len(eligible)} target users have a document of "
                            f"{self.canary_length}+ words: lower canary_users or canary_length, or raise record_chars")
        for i in sorted(crng.choice(len(eligible), size=self.canary_users, replace=False).tolist()):
            u = eligible[i]
            s = _draw_canary(u["bodies"], self.canary_length, crng)
            u["canary"] = s
            u["bodies"] = [insert_at_word_boundary(b, s, crng) for b in u["bodies"]]

        def docs_of(u: dict[str, Any]) -> list[str]:
            r = _rng("phrases-per-doc", self.seed, u["user"])
            return [_frame(u, b, u["phrases"][int(r.integers(2))]) for b in u["bodies"]]

        targets: list[TargetRecord] = []
        meta: dict[str, dict[str, Any]] = {}
        user_samples: dict[str, list[str]] = {}

        def set_aside(u: dict[str, Any], docs: list[str]) -> set[int]:
            k = min(len(docs) - 1, max(1, int(round(self.attacker_fraction * len(docs)))))
            return set(_rng("attacker", self.seed, u["user"]).choice(len(docs), size=k, replace=False).tolist())

        for u in target_users:
            docs = docs_of(u)
            aside = set_aside(u, docs)
            user_samples[u["user"]] = [d for j, d in enumerate(docs) if j in aside]
            for j, d in enumerate(docs):
                if j in aside:
                    continue
                rid = f"user-{hashlib.sha1(d.encode('utf-8')).hexdigest()[:12]}"
                targets.append(TargetRecord(rid, d))
                meta[rid] = {"user": u["user"], "canary": "canary" in u}
                if "canary" in u:
                    meta[rid]["canary_substring"] = u["canary"]
        # background users set aside the same share of their documents as target users do, and theirs are published
        # too: a world draws its target users from both partitions (bench.pools.split_user_pool), and an owner's
        # number of records in D says nothing about whether it is a target user
        adapt_docs: list[tuple[str, str]] = []
        for u in adapt_users:
            docs = docs_of(u)
            aside = set_aside(u, docs)
            user_samples[u["user"]] = [d for j, d in enumerate(docs) if j in aside]
            adapt_docs += [(d, u["user"]) for j, d in enumerate(docs) if j not in aside]
        adapt = tuple(d for d, _ in adapt_docs)
        pop_docs = [(t, f"record:{i}") for i, t in enumerate(base.population) if i not in used_pop]
        pop_docs += [(d, u["user"]) for u in pop_users for d in docs_of(u)]
        mix = _rng("population-order", self.seed).permutation(len(pop_docs)).tolist()
        population = tuple(pop_docs[i][0] for i in mix)
        population_owners = tuple(pop_docs[i][1] for i in mix)
        public_format = {
            "kind": "users", "unit": "user", "attacker_fraction": self.attacker_fraction,
            "document": "greeting / body (mini_pile text) / personal phrase / sign-off / signature",
            "user_samples": user_samples,
        }
        all_docs = [t.text for t in targets] + list(adapt) + [d for v in user_samples.values() for d in v]
        if len(set(all_docs)) != len(all_docs):  # pragma: no cover - bodies are distinct, names unique
            raise DataError("task 'synthetic_users': two user documents are identical")

        fingerprint = derived_fingerprint({"name": self.name, "config": self.config, "base": base.fingerprint,
                                           "public_format": public_format, "faker": faker.VERSION, "meta": meta},
                                          targets, adapt, population)
        synthetic = {"name": "synthetic_users", "kind": "users", "version": faker.VERSION,
                     "description": f"synthetic users (Faker locales {', '.join(self.locales)}, seed {self.seed}) "
                                    f"writing mail-like documents around mini_pile records",
                     "provenance": f"generated by privbench (Faker {faker.VERSION} identities and phrases)",
                     "license": "synthetic; Faker MIT; bodies under the mini_pile sources' licenses"}
        stats = partition_stats(pretrain=base.pretrain, heldout=base.heldout, population=population, adapt=adapt,
                                targets=[t.text for t in targets])
        stats["users"] = {
            "targets": _spread([u["n_docs"] for u in target_users]),
            "adapt": _spread([u["n_docs"] for u in adapt_users]),
            "population": _spread([u["n_docs"] for u in pop_users]),
            "attacker_samples": sum(len(v) for v in user_samples.values()),
            "background_set_aside": sum(u["n_docs"] for u in adapt_users) - len(adapt),
            "canary_users": self.canary_users, "canary_length": self.canary_length,
            "docs_distribution": self.docs_distribution,
        }
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=base.heldout, population=population, adapt=adapt,
            targets=tuple(targets), fingerprint=fingerprint, sources=tuple(base.sources) + (synthetic,),
            stats=stats, relation="ood", unit="user", target_meta=meta, public_format=public_format,
            adapt_owners=tuple(u for _, u in adapt_docs), population_owners=population_owners,
        )
