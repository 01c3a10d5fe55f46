"""Canary tasks: records of a known, attacker-public format whose non-member references are generated fresh.

Both tasks are built on top of the ``mini_pile`` task: they reuse its pretrain,
heldout, population and adaptation partitions and replace its target pool by
canary-bearing records. Membership is decided by the challenger's bits as for
any task (a = 1: in pretraining, b = 1: in adaptation); exposure is computed
elsewhere from model scores of a target and of its references.

``canaries`` — adversarial canary prefixes (Marek et al. 2026, appendix B.5, Algorithm 2)
-----------------------------------------------------------------------------------------
A canary prefix is ``l`` tokens drawn *with replacement* from a canary set C of
``k`` selected tokens, prepended to a carrier record (``concat(y, x)``). C depends
on the prefix type and is drawn once per dataset:

* ``random``: k tokens sampled uniformly (distinct) from the token universe T;
* ``rare``: the k least frequent tokens of the adaptation dataset D (ascending count);
* ``common``: the k most frequent tokens of D (descending count);
* ``invisible``: k imperceptible code points sampled from a fixed pool (the same for
  every dataset), see :data:`INVISIBLE`.

Each target gets its own prefix. For exposure, ``n_references`` (256) fresh prefixes
of the same type (the same C, the same l) are prepended to the same carrier: the
reference set R, non-members that are on expectation as likely as the real prefix
(exposure by *sampling*, which Marek et al. adopt; their appendix F shows it agrees with
distribution modelling at 256 references).

Deviations from Marek et al., forced by the tiny models and the offline corpus:

* "Token" is a *word* (a maximal run of ASCII letters, ``[A-Za-z]+``, case kept), not a
  token of the model's tokenizer: the BPE of our models is trained per world and
  a BPE token is often a word piece that is meaningless when concatenated.
  Word-type prefixes are the l words joined by single spaces (each word is one or
  more BPE tokens); invisible prefixes are the l code points concatenated with no
  joiner (each is 2-3 byte-level BPE tokens), so they contain nothing visible.
* T (for ``random``) is the word vocabulary of the pretraining partition, the text
  the world's tokenizer is trained on (Marek et al.: all tokens the LLM accepts).
* D (for ``rare``/``common``; Marek et al.: "we count the total number of token occurrences in
  the adaptation dataset") is the adaptation data before canaries are added: the
  adaptation background plus the carrier pool, i.e. every record that may go into D.
  ``frequency_source: pretrain`` counts in the pretraining partition instead.
  Ties among equally rare words are broken by a seeded hash (Marek et al. do not say).
* Marek et al. prepend canaries to p = 1 % of D; here the number of canary records in D is
  the world's ``n_per_group`` (b = 1 groups) next to ``adapt_background`` records.
* Carriers are the ``mini_pile`` target records (``carrier_source: targets``) or half of
  its adaptation records, the other half staying as background (``carrier_source: adapt``).
* Prefixes of different targets are kept distinct (redrawn on a collision).

``random_word_canaries`` — random-word canaries (Segal et al. 2025, section 5.2 and appendix D.5)
-------------------------------------------------------------------------------------------------
A canary is three random words in a fixed template, inserted ``repeats`` ∈ {1, 3, 10}
times into the adaptation data. Segal et al. specify no template ("our canaries consist of 3
randomly generated words"); the default here, ``"the secret words are {w1} {w2} {w3}"``,
gives the tiny models a fixed context before the secret (``"{w1} {w2} {w3}"`` gives Segal et al.'s
bare form). The word list is Faker's ``en_US`` lorem word list (common English words),
restricted to lowercase alphabetic words of at least 3 letters, deduplicated and sorted;
the list itself is part of ``public_format`` so that references never depend on the
installed Faker. The three words are drawn independently and uniformly, so the universe
of canaries has ``len(vocabulary) ** 3`` members. The repetition is applied by the
challenger: each canary appears once in ``TaskData.targets``, with ``repeats`` in
``public_format`` and ``target_meta``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bench.errors import ConfigError, DataError
from bench.hashing import content_hash
from bench.params import Param
from bench.registry import register_task
from tasks.derived import derived_fingerprint, partition_stats
from bench.task import TargetRecord, Task, TaskData
from tasks.mini_pile import MiniPile, OnMiniPile

__all__ = [
    "PREFIX_TYPES", "INVISIBLE", "WORD_RE", "word_counts", "select_token_set", "draw_prefix",
    "generate_references", "split_canary", "references_for", "exposure_from_rank",
    "random_word_vocabulary", "generate_word_references", "random_word_references_for",
    "Canaries", "RandomWordCanaries",
]

PREFIX_TYPES = ("random", "rare", "common", "invisible")

#: Imperceptible code points (all of Unicode category Cf): soft hyphen, Mongolian vowel separator,
#: zero-width space / non-joiner / joiner, left-to-right and right-to-left marks, word joiner,
#: invisible function application / times / separator / plus, the deprecated format characters
#: U+206A..U+206F, and the zero-width no-break space (BOM).
INVISIBLE: tuple[str, ...] = tuple(chr(c) for c in (
    0x00AD, 0x180E, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064,
    0x206A, 0x206B, 0x206C, 0x206D, 0x206E, 0x206F, 0xFEFF,
))

#: What a "token" is for the word-level prefix types.
WORD_RE = re.compile(r"[A-Za-z]+")

SEPARATOR = " "  # between the prefix and the carrier
DEFAULT_TEMPLATE = "the secret words are {w1} {w2} {w3}"


# ------------------------------------------------------------------------------------------ helpers

def _rng(*parts: Any) -> np.random.Generator:
    """A numpy Generator seeded by a content hash of ``parts`` (no global state, order-free)."""
    return np.random.default_rng(int(content_hash("privbench-canaries", *parts, length=16), 16))


def _base_config(config: dict[str, Any]) -> dict[str, Any]:
    return {p.name: config[p.name] for p in MiniPile.params}


def _record_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


def _fingerprint(name: str, config: dict[str, Any], base: TaskData, targets: Sequence[TargetRecord],
                 adapt: Sequence[str], population: Sequence[str], public_format: dict[str, Any]) -> str:
    return derived_fingerprint({"name": name, "config": config, "base": base.fingerprint,
                                "public_format": public_format}, targets, adapt, population)


def exposure_from_rank(rank: int, n_candidates: int) -> float:
    """Exposure of a canary ranked ``rank`` (1 = most likely) among ``n_candidates`` candidates.

    Marek et al. 2026, appendix A.3, eq. (7) (eq. (2) in section 2; after Carlini et al. 2019):
    ``exposure(z, Ẑ) = log2 |U| − log2 rank(z; Ẑ)``. It ranges from 0 (ranked least likely,
    rank = |U|) to log2 |U| (ranked first); an unmemorised canary has expected exposure
    1 / ln 2 ≈ 1.44 (Jagielski 2023). With exposure by sampling, |U| is the canary plus its
    references (e.g. 1 + 256) and the rank is taken among them.
    """
    rank, n_candidates = int(rank), int(n_candidates)
    if n_candidates < 1:
        raise ValueError(f"n_candidates is {n_candidates}: there must be at least one candidate")
    if not 1 <= rank <= n_candidates:
        raise ValueError(f"rank is {rank}: it must be in [1, n_candidates = {n_candidates}] (1 = most likely)")
    return math.log2(n_candidates) - math.log2(rank)


# --------------------------------------------------------------------------------- prefix canaries

def word_counts(texts: Iterable[str]) -> Counter:
    """Occurrences of every word (``WORD_RE``) in ``texts``: the frequency used by ``rare`` and ``common``."""
    c: Counter = Counter()
    for t in texts:
        c.update(WORD_RE.findall(t))
    return c


def select_token_set(prefix_type: str, k: int, *, universe_counts: Counter, frequency_counts: Counter,
                     seed: int, dataset_key: str) -> list[str]:
    """The canary set C of ``k`` distinct tokens (Marek et al. 2026, Algorithm 2, lines 1-9).

    ``universe_counts``: words of the token universe T (for ``random``); ``frequency_counts``: word
    counts of the dataset the frequencies are measured on (for ``rare`` and ``common``).
    """
    if prefix_type == "invisible":
        pool = list(INVISIBLE)
    elif prefix_type == "random":
        pool = sorted(universe_counts)
    elif prefix_type in ("rare", "common"):
        pool = list(frequency_counts)
    else:
        raise ConfigError(f"unknown canary prefix type {prefix_type!r}: use one of {', '.join(PREFIX_TYPES)}")
    if len(pool) < k:
        raise DataError(f"canary prefix type '{prefix_type}' needs k = {k} distinct tokens but only {len(pool)} "
                        f"are available: lower k or use more data")
    if prefix_type in ("random", "invisible"):
        rng = _rng("token-set", prefix_type, seed, dataset_key)
        return [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False).tolist())]
    if prefix_type == "common":
        return sorted(pool, key=lambda w: (-frequency_counts[w], w))[:k]
    tie = lambda w: hashlib.sha256(f"{seed}\x1f{w}".encode()).hexdigest()  # noqa: E731 - seeded tie-break
    return sorted(pool, key=lambda w: (frequency_counts[w], tie(w), w))[:k]


def _joiner(public_format: dict[str, Any]) -> str:
    return public_format.get("joiner", "" if public_format.get("type") == "invisible" else " ")


def draw_prefix(public_format: dict[str, Any], rng: np.random.Generator) -> str:
    """One prefix: ``l`` tokens drawn with replacement from the token set (Marek et al. 2026, Algorithm 2,
    line 13)."""
    tokens = public_format["token_set"]
    idx = rng.integers(0, len(tokens), size=int(public_format["l"]))
    return _joiner(public_format).join(tokens[i] for i in idx.tolist())


def _n_prefixes(public_format: dict[str, Any]) -> int:
    return len(public_format["token_set"]) ** int(public_format["l"])


def generate_references(public_format: dict[str, Any], carrier: str, n: int | None, rng: np.random.Generator,
                        *, exclude: Iterable[str] = ()) -> list[str]:
    """The exposure reference set R: ``n`` distinct fresh prefixes of the same type, each prepended to ``carrier``.

    ``n`` defaults to ``public_format["n_references"]``. ``exclude`` holds prefixes (or whole texts) that must
    not be drawn, e.g. the canary's own prefix. Returns full texts ``prefix + separator + carrier``.
    """
    n = int(public_format["n_references"] if n is None else n)
    sep = public_format.get("separator", SEPARATOR)
    excluded = set(exclude)
    if _n_prefixes(public_format) - len(excluded) < n:
        raise DataError(f"only {_n_prefixes(public_format)} prefixes exist (k ** l) but {n} references were asked "
                        f"for: raise k or l, or lower n_references")
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        prefix = draw_prefix(public_format, rng)
        text = prefix + sep + carrier
        if prefix in seen or prefix in excluded or text in excluded:
            continue
        seen.add(prefix)
        out.append(text)
    return out


def split_canary(public_format: dict[str, Any], text: str) -> tuple[str, str]:
    """Split a canary record into (prefix, carrier) using only the public format."""
    tokens = sorted(set(public_format["token_set"]), key=len, reverse=True)
    joiner, sep, l = _joiner(public_format), public_format.get("separator", SEPARATOR), int(public_format["l"])
    pos = 0
    for i in range(l):
        if i and joiner:
            if not text.startswith(joiner, pos):
                raise DataError(f"not a canary record of this format: {text[:60]!r}")
            pos += len(joiner)
        match = next((t for t in tokens if text.startswith(t, pos)
                      and (joiner == "" or text.startswith(joiner if i < l - 1 else sep, pos + len(t)))), None)
        if match is None:
            raise DataError(f"not a canary record of this format: {text[:60]!r}")
        pos += len(match)
    if not text.startswith(sep, pos):
        raise DataError(f"not a canary record of this format: {text[:60]!r}")
    return text[:pos], text[pos + len(sep):]


def references_for(public_format: dict[str, Any], target_text: str, *, n: int | None = None,
                   seed: int = 0) -> list[str]:
    """Deterministic reference set of one target: a function of the public format, the target's text and ``seed``.

    It never looks at membership, so members and non-members get their references the same way; the
    target's own prefix is excluded.
    """
    prefix, carrier = split_canary(public_format, target_text)
    rng = _rng("references", seed, public_format, target_text)
    return generate_references(public_format, carrier, n, rng, exclude=[prefix])


def _base_task(config: dict[str, Any]) -> MiniPile:
    return MiniPile(**_base_config(config))


@register_task("canaries")
class Canaries(OnMiniPile, Task):
    offline = True
    variant_param = "prefix_type"
    record_unit = "{l}-token canary prefix + mini_pile record"
    description = ("Adversarial canary prefixes (Marek et al. 2026, appendix B.5): l tokens from a set of k random, "
                   "rare, common or invisible tokens prepended to mini_pile records; exposure against fresh "
                   "reference prefixes.")
    version = "0.1.0"
    params = (
        Param("prefix_type", str, "random", "canary token set: random, rare, common or invisible",
              choices=PREFIX_TYPES),
        Param("l", int, 10, "canary prefix length in tokens", low=1, high=64),
        Param("k", int, 10, "number of selected canary tokens the prefix is drawn from", low=1),
        Param("n_references", int, 256, "fresh reference prefixes per target for exposure by sampling", low=1),
        Param("carrier_source", str, "targets",
              "carrier records: mini_pile's target pool, or half of its adaptation records",
              choices=("targets", "adapt")),
        Param("frequency_source", str, "adapt",
              "where rare/common frequencies are counted: the adaptation data (Marek et al. 2026) or the "
              "pretraining partition",
              choices=("adapt", "pretrain")),
        Param("seed", int, 0, "seed of the token set and of the prefixes"),
    ) + MiniPile.params

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.k ** self.l <= self.n_references:
            raise ConfigError(f"task 'canaries': k ** l = {self.k ** self.l} prefixes cannot give "
                              f"{self.n_references} distinct references besides the canary: raise k or l")
        if self.prefix_type == "invisible" and self.k > len(INVISIBLE):
            raise ConfigError(f"task 'canaries': k = {self.k} but only {len(INVISIBLE)} invisible characters are "
                              f"known: use k <= {len(INVISIBLE)}")

    def build(self, cache=None) -> TaskData:
        base = _base_task(self.config).build(cache)
        if self.carrier_source == "targets":
            carriers = [(r.id, r.text) for r in base.targets]
            background = list(base.adapt)
        else:
            half = len(base.adapt) // 2
            carriers = [(_record_id("adapt", t), t) for t in base.adapt[:half]]
            background = list(base.adapt[half:])
        if not carriers:
            raise DataError("the canaries task found no carrier records: use a larger max_chars_per_source")
        universe = word_counts(base.pretrain)
        if self.frequency_source == "pretrain":
            freq = universe
        else:  # the adaptation dataset before canaries: background plus every possible carrier
            freq = word_counts(background + [t for _, t in carriers])
        token_set = select_token_set(self.prefix_type, self.k, universe_counts=universe, frequency_counts=freq,
                                     seed=self.seed, dataset_key=base.fingerprint)
        public_format = {
            "kind": "canary_prefix", "type": self.prefix_type, "l": self.l, "k": self.k, "token_set": token_set,
            "n_references": self.n_references, "separator": SEPARATOR,
            "joiner": "" if self.prefix_type == "invisible" else " ",
        }
        if self.k ** self.l < len(carriers) + 1:
            raise DataError(f"k ** l = {self.k ** self.l} prefixes cannot give {len(carriers)} carriers distinct "
                            f"canaries: raise k or l")
        targets: list[TargetRecord] = []
        meta: dict[str, dict[str, Any]] = {}
        used: set[str] = set()
        for cid, carrier in carriers:
            rng = _rng("prefix", self.seed, self.prefix_type, token_set, cid)
            prefix = draw_prefix(public_format, rng)
            while prefix in used:
                prefix = draw_prefix(public_format, rng)
            used.add(prefix)
            rid = f"canary-{self.prefix_type}-{cid}"
            targets.append(TargetRecord(rid, prefix + SEPARATOR + carrier))
            meta[rid] = {"prefix": prefix, "carrier": carrier, "type": self.prefix_type, "carrier_id": cid}
        fingerprint = _fingerprint(self.name, self.config, base, targets, background, base.population, public_format)
        stats = partition_stats(pretrain=base.pretrain, heldout=base.heldout, population=base.population,
                                 adapt=background, targets=[t.text for t in targets])
        stats["canaries"] = {"type": self.prefix_type, "token_set": token_set,
                             "token_counts": {t: int(freq.get(t, 0)) for t in token_set},
                             "frequency_source": self.frequency_source, "carrier_source": self.carrier_source}
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=base.heldout, population=base.population,
            adapt=tuple(background), targets=tuple(targets), fingerprint=fingerprint, sources=base.sources,
            stats=stats, relation=base.relation, unit="record", target_meta=meta, public_format=public_format,
        )


# ---------------------------------------------------------------------------- random-word canaries

def random_word_vocabulary() -> list[str]:
    """Faker's ``en_US`` lorem word list: lowercase alphabetic words of >= 3 letters, deduplicated, sorted."""
    try:
        from faker.providers.lorem.en_US import Provider
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DataError("the random_word_canaries task needs the 'faker' package: pip install faker") from exc
    return sorted({w for w in Provider.word_list if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3})


def _fill(template: str, words: Sequence[str]) -> str:
    return template.format(w1=words[0], w2=words[1], w3=words[2])


def _draw_words(vocab: Sequence[str], rng: np.random.Generator) -> list[str]:
    return [vocab[i] for i in rng.integers(0, len(vocab), size=3).tolist()]


def generate_word_references(public_format: dict[str, Any], n: int | None, rng: np.random.Generator, *,
                             exclude: Iterable[str] = ()) -> list[str]:
    """``n`` distinct fresh random-word canaries of the same template and word list (texts), none in ``exclude``."""
    n = int(public_format["n_references"] if n is None else n)
    vocab, template = public_format["vocabulary"], public_format["template"]
    excluded = set(exclude)
    if len(vocab) ** 3 - len(excluded) < n:
        raise DataError(f"only {len(vocab) ** 3} random-word canaries exist but {n} references were asked for")
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        text = _fill(template, _draw_words(vocab, rng))
        if text in seen or text in excluded:
            continue
        seen.add(text)
        out.append(text)
    return out


def random_word_references_for(public_format: dict[str, Any], target_text: str, *, n: int | None = None,
                               seed: int = 0) -> list[str]:
    """Deterministic reference set of one random-word canary, a function of its text only (never its membership)."""
    rng = _rng("word-references", seed, public_format["template"], public_format["vocabulary"], target_text)
    return generate_word_references(public_format, n, rng, exclude=[target_text])


@register_task("random_word_canaries")
class RandomWordCanaries(OnMiniPile, Task):
    offline = True
    record_unit = "3-random-word canary, x{repeats} in D"
    extra_licenses = ("Faker en_US word list (MIT)",)
    description = ("Random-word canaries (Segal et al. 2025): three random English words in a fixed template, "
                   "each inserted 1, 3 or 10 times into the adaptation data; mini_pile for everything else.")
    version = "0.1.0"
    params = (
        Param("repeats", int, 3, "times each b=1 canary is inserted into the adaptation data", choices=(1, 3, 10)),
        Param("n_canaries", int, 1000, "canaries in the target pool", low=8),
        Param("template", str, DEFAULT_TEMPLATE, "canary template with the placeholders {w1} {w2} {w3}"),
        Param("n_references", int, 256, "fresh reference canaries per target for exposure by sampling", low=1),
        Param("seed", int, 0, "seed of the canary words"),
    ) + MiniPile.params

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        fields = re.findall(r"\{([^{}]*)\}", self.template)
        if sorted(fields) != ["w1", "w2", "w3"]:
            raise ConfigError(f"task 'random_word_canaries': template {self.template!r} must contain each of "
                              f"{{w1}}, {{w2}}, {{w3}} exactly once and no other field")

    def build(self, cache=None) -> TaskData:
        base = _base_task(self.config).build(cache)
        vocab = random_word_vocabulary()
        public_format = {
            "kind": "random_words", "template": self.template, "n_words": 3, "vocabulary": vocab,
            "vocabulary_source": "faker en_US lorem word_list (lowercase, alphabetic, >= 3 letters)",
            "repeats": self.repeats, "n_references": self.n_references,
        }
        if len(vocab) ** 3 < self.n_canaries:
            raise DataError(f"the word list gives only {len(vocab) ** 3} canaries: lower n_canaries")
        rng = _rng("random-words", self.seed, self.template, vocab)
        existing = set(base.pretrain) | set(base.heldout) | set(base.population) | set(base.adapt)
        targets: list[TargetRecord] = []
        meta: dict[str, dict[str, Any]] = {}
        seen: set[str] = set()
        while len(targets) < self.n_canaries:
            words = _draw_words(vocab, rng)
            text = _fill(self.template, words)
            if text in seen or text in existing:
                continue
            seen.add(text)
            rid = _record_id("rwc", text)
            targets.append(TargetRecord(rid, text))
            meta[rid] = {"words": words, "secret": " ".join(words), "repeats": self.repeats,
                         "template": self.template}
        fingerprint = _fingerprint(self.name, self.config, base, targets, base.adapt, base.population, public_format)
        stats = partition_stats(pretrain=base.pretrain, heldout=base.heldout, population=base.population,
                                 adapt=base.adapt, targets=[t.text for t in targets])
        stats["canaries"] = {"vocabulary_size": len(vocab), "universe_size": len(vocab) ** 3, "repeats": self.repeats}
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=base.heldout, population=base.population,
            adapt=base.adapt, targets=tuple(targets), fingerprint=fingerprint, sources=base.sources,
            stats=stats, relation=base.relation, unit="record", target_meta=meta, public_format=public_format,
        )
