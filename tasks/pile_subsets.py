"""Offline mini-Pile subsets: named sets of real text, each a stand-in for a Pile subset or an
out-of-distribution set of Marek et al. 2026, all built from data that ships with installed packages.

One task, ``pile_subset``, with a ``subset`` parameter (see :data:`SUBSETS`). Every subset task
shares one **pretraining partition**: the ``pretrain`` partition that
:func:`tasks.corpus.build_corpus` makes from the pretraining mixture ``pretrain_sources``
(default ``stdlib_code + shakespeare + wikipedia``). With the same mixture, budget, record size and
salt, every subset gives the identical ``pretrain`` tuple, so one tokenizer and one pretrained
model can serve all of them. Only ``heldout``, ``population``, ``adapt`` and ``targets`` come from
the subset, according to its **relation** to the pretraining corpus:

``iid``
    The subset's source is part of the pretraining mixture; its held-out documents (the corpus'
    non-pretrain partitions restricted to that source) give the four pools. For ``code`` these are
    held-out standard-library modules: the IID validation analogue of Pile GitHub.
``ood``
    The subset's source is *not* in the mixture; its documents are partitioned on their own with
    the corpus weights minus ``pretrain`` (renormalised), or the subset's own ``weights`` where a
    small source needs them (see :data:`SUBSETS`).
``overlap``
    The subset's source is in the mixture, and the ``adapt`` and ``targets`` pools are drawn from
    records **of the pretraining partition** of that source (a salted hash picks each record for
    adapt, targets or neither; expected pool sizes match the iid ones). ``heldout`` and
    ``population`` still come from held-out documents. Every target is therefore already in S:
    inserting it into S again (the game's ``a`` bit) changes nothing, so the ``a`` bit is not
    controlled and the games that contrast ``a`` (``pretrain``, ``joint/*``, ``post_adapt``) are
    meaningless; only the ``b`` contrasts (``adapt``, ``null``) keep their meaning. The runner can
    detect this case with ``TaskData.relation == "overlap"``.

Leakage control (word 13-grams, lowercased whitespace tokens, as in :mod:`tasks.corpus`):
exact duplicates (whitespace/case-normalised) of a pretraining record are removed; no
heldout/population/adapt/targets record shares a 13-gram with the pretraining partition (except
adapt/targets under ``overlap``, which are pretraining records by design); no heldout/population
record shares a 13-gram with adapt or targets. Partitions are document-level and hash-based
(:func:`tasks.partition.assign_partition` of ``"<source>/<doc_id>"`` under the salt) and records in
a partition are ordered by ``stable_hash(salt, record.id)``: the build is a pure function of its
parameters and the installed data, and it is cached by content key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from bench.cache import ArtifactCache
from bench.errors import ConfigError, DataError
from bench.hashing import CACHE_SCHEMA, content_hash
from bench.params import Param
from bench.registry import register_task
from bench.task import Task, TaskData
from tasks.corpus import (
    CORPUS_LAYOUT, CORPUS_VERSION, DEFAULT_WEIGHTS, NGRAM, PARTITIONS, Record, build_corpus, ngram_hashes,
    task_data_from_rows,
)
from tasks.partition import assign_partition, chunk_text, normalized_key, stable_hash
from tasks.sources import Document, get_source

__all__ = [
    "SUBSETS",
    "RELATIONS",
    "DEFAULT_PRETRAIN_SOURCES",
    "PILE_SUBSETS_VERSION",
    "SubsetCorpus",
    "build_subset",
    "resolve_relation",
    "PileSubset",
]

#: Bump when the subset build algorithm changes (part of every cache key).
PILE_SUBSETS_VERSION = 1
RELATIONS = ("iid", "ood", "overlap")
DEFAULT_PRETRAIN_SOURCES = ("stdlib_code", "shakespeare", "wikipedia")
NON_MEMBER = ("heldout", "population", "adapt", "targets")
_PROTECTED = ("adapt", "targets")
_CHECKED = ("heldout", "population")
_SUBSET_DOMAIN = "subset"  # budget order hash, as in tasks.corpus
_OVERLAP_DOMAIN = "overlap"

# Small out-of-distribution sources cannot fill four pools at the corpus weights (a renormalised
# 20% would leave a handful of targets): they weight the target pool up instead.
_SMALL_OOD_WEIGHTS = {"heldout": 0.15, "population": 0.15, "adapt": 0.2, "targets": 0.5}

#: name -> source, natural relation under the default mixture, what it stands in for, and, where a
#: small source needs them, its own non-pretrain partition weights (used under ``ood`` only).
SUBSETS: dict[str, dict[str, Any]] = {
    "code": {
        "source": "stdlib_code",
        "relation": "iid",
        "stand_in": "Pile GitHub (code); held-out standard-library modules are the IID validation analogue",
    },
    "wiki": {
        "source": "wikipedia",
        "relation": "iid",
        "stand_in": "Pile Wikipedia (en): encyclopedic prose",
    },
    "books": {
        "source": "shakespeare",
        "relation": "iid",
        "stand_in": "Pile Books3 / BookCorpus2 / PG-19: books-like long prose",
    },
    "news": {
        "source": "news",
        "relation": "ood",
        "stand_in": ("near-OOD English news prose, absent from the pretraining mixture "
                     "(the news share of Pile-CC / OpenWebText2): same language, new genre"),
    },
    "dialogue_en": {
        "source": "dialogue_en",
        "relation": "ood",
        "stand_in": "SAMSum-like OOD set: short English dialogue, a genre absent from pretraining",
        "weights": _SMALL_OOD_WEIGHTS,
    },
    "dialogue_de": {
        "source": "dialogue_de",
        "relation": "ood",
        "stand_in": "GermanWiki-like OOD set: another language (German dialogue); very small",
        "weights": _SMALL_OOD_WEIGHTS,
    },
}


def resolve_relation(subset: str, relation: str, pretrain_sources: Sequence[str]) -> str:
    """The relation a (subset, relation, mixture) triple means; ConfigError if inconsistent.

    ``"auto"`` is iid when the subset's source is in the mixture and ood otherwise (under the
    default mixture this is the natural relation listed in :data:`SUBSETS`).
    """
    if subset not in SUBSETS:
        raise ConfigError(f"unknown subset {subset!r}: use one of {', '.join(SUBSETS)}")
    source = SUBSETS[subset]["source"]
    inside = source in pretrain_sources
    if relation == "auto":
        return "iid" if inside else "ood"
    if relation not in RELATIONS:
        raise ConfigError(f"unknown relation {relation!r}: use auto or one of {', '.join(RELATIONS)}")
    if relation in ("iid", "overlap") and not inside:
        raise ConfigError(f"subset {subset!r} with relation {relation!r} needs its source {source!r} in "
                          f"pretrain_sources ({', '.join(pretrain_sources)}): add it, or use relation ood")
    if relation == "ood" and inside:
        raise ConfigError(f"subset {subset!r} with relation 'ood' needs its source {source!r} outside "
                          f"pretrain_sources ({', '.join(pretrain_sources)}): remove it, or use relation iid")
    return relation


# --------------------------------------------------------------------------- result


@dataclass
class SubsetCorpus:
    subset: str
    relation: str
    partitions: dict[str, list[Record]]
    sources: list[dict[str, Any]]  # SourceInfo.to_dict() + "role"
    params: dict[str, Any] = field(default_factory=dict)

    def _hash(self, names: Iterable[str], with_params: bool) -> str:
        h = hashlib.sha256()
        if with_params:
            h.update(json.dumps(self.params, sort_keys=True, separators=(",", ":")).encode("utf-8"))
        for name in names:
            h.update(b"\x1e" + name.encode("utf-8"))
            for rec in self.partitions.get(name, []):
                h.update(b"\x1f" + rec.id.encode("utf-8"))
        return h.hexdigest()

    def fingerprint(self) -> str:
        """sha256 over the build params and all record ids in partition order."""
        return self._hash(PARTITIONS, True)

    def pretrain_fingerprint(self) -> str:
        """sha256 over the pretrain record ids alone: equal for every subset of one mixture."""
        return self._hash(("pretrain",), False)

    def stats(self) -> dict[str, Any]:
        """Per partition: n_records, n_chars, n_docs, by_source; plus "meta" (subset, relation, ...)."""
        out: dict[str, Any] = {}
        for part in PARTITIONS:
            recs = self.partitions.get(part, [])
            by_source: dict[str, int] = {}
            for rec in recs:
                by_source[rec.source] = by_source.get(rec.source, 0) + 1
            out[part] = {
                "n_records": len(recs),
                "n_chars": sum(len(r.text) for r in recs),
                "n_docs": len({(r.source, r.doc_id) for r in recs}),
                "by_source": dict(sorted(by_source.items())),
            }
        out["meta"] = {
            "subset": self.subset,
            "relation": self.relation,
            "source": SUBSETS[self.subset]["source"],
            "stand_in": SUBSETS[self.subset]["stand_in"],
            "pretrain_sources": list(self.params.get("pretrain_sources", [])),
            "weights": self.params.get("weights"),
            "pretrain_fingerprint": self.pretrain_fingerprint(),
        }
        return out


# --------------------------------------------------------------------------- helpers


def _record_id(source: str, text: str) -> str:
    return f"{source}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


def _budgeted(docs: Iterable[Document], salt: str, budget: int | None) -> list[Document]:
    """The documents kept under a per-source character budget, as tasks.corpus selects them."""
    docs = list(docs)
    if budget is None:
        return docs

    def key(d: Document) -> str:
        return f"{d.source}/{d.doc_id}"

    kept, used = [], 0
    for doc in sorted(docs, key=lambda d: (stable_hash(_SUBSET_DOMAIN, salt, key(d)), key(d))):
        if used >= budget:
            break
        kept.append(doc)
        used += len(doc.text)
    return kept


def _gram_index(texts: Sequence[str]) -> np.ndarray:
    hashes, _ = ngram_hashes(list(texts), NGRAM)
    return np.unique(hashes)


def _overlapping(texts: Sequence[str], reference: np.ndarray) -> np.ndarray:
    """Boolean per text: does it share a word 13-gram with ``reference`` (sorted unique hashes)?"""
    flagged = np.zeros(len(texts), dtype=bool)
    if not texts or reference.size == 0:
        return flagged
    hashes, owner = ngram_hashes(list(texts), NGRAM)
    if hashes.size:
        flagged[owner[np.isin(hashes, reference)]] = True
    return flagged


def _order(records: list[Record], salt: str) -> list[Record]:
    return sorted(records, key=lambda r: (stable_hash(salt, r.id), r.id))


def _ood_pools(source_name: str, weights: dict[str, float], pretrain: list[Record], *, record_chars: int,
               min_chars: int, max_chars_per_source: int | None, salt: str) -> tuple[dict[str, list[Record]], dict]:
    """Partition a source outside the mixture into the four non-member pools."""
    src = get_source(source_name)
    docs = _budgeted(src.documents(), salt, max_chars_per_source)
    candidates: list[tuple[int, str, int, Document, str]] = []
    for doc in docs:
        key = f"{doc.source}/{doc.doc_id}"
        part = assign_partition(key, salt, weights)
        for pos, chunk in enumerate(chunk_text(doc.text, record_chars, min_chars)):
            candidates.append((NON_MEMBER.index(part), key, pos, doc, chunk))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    seen = {normalized_key(r.text) for r in pretrain}  # exact duplicates of pretraining records go
    pools: dict[str, list[Record]] = {p: [] for p in NON_MEMBER}
    for pidx, _key, _pos, doc, text in candidates:
        nk = normalized_key(text)
        if nk in seen:
            continue
        seen.add(nk)
        pools[NON_MEMBER[pidx]].append(Record(id=_record_id(doc.source, text), text=text, source=doc.source,
                                              doc_id=doc.doc_id))
    return pools, {"n_documents": len(docs)}


def _overlap_pools(records: list[Record], weights: dict[str, float], salt: str) -> dict[str, list[Record]]:
    """Pick adapt/targets from pretraining records with the iid pools' expected shares."""
    w_pre = float(weights["pretrain"])
    bounds = [("adapt", weights["adapt"] / w_pre), ("targets", (weights["adapt"] + weights["targets"]) / w_pre)]
    pools: dict[str, list[Record]] = {"adapt": [], "targets": []}
    for rec in records:
        u = stable_hash(_OVERLAP_DOMAIN, salt, rec.id) / float(2**64)
        for name, upper in bounds:
            if u < upper:
                pools[name].append(rec)
                break
    return pools


# --------------------------------------------------------------------------- build


def build_subset(
    subset: str,
    *,
    relation: str = "auto",
    pretrain_sources: Sequence[str] = DEFAULT_PRETRAIN_SOURCES,
    max_chars_per_source: int | None = 3_000_000,
    record_chars: int = 320,
    min_chars: int = 120,
    salt: str = "privbench-v1",
) -> SubsetCorpus:
    """Build one subset (see the module docstring for the rules)."""
    if isinstance(pretrain_sources, str):
        pretrain_sources = (pretrain_sources,)
    mixture = list(dict.fromkeys(pretrain_sources))
    rel = resolve_relation(subset, relation, mixture)
    spec = SUBSETS[subset]
    source_name = spec["source"]

    # The pretraining partition, exactly as the mini-Pile corpus of this mixture makes it.
    corpus = build_corpus(tuple(mixture), record_chars=record_chars, min_chars=min_chars,
                          max_chars_per_source=max_chars_per_source, salt=salt)
    pretrain = list(corpus.partitions["pretrain"])

    if rel == "ood":
        weights = dict(spec.get("weights") or {p: DEFAULT_WEIGHTS[p] for p in NON_MEMBER})
        pools, _info = _ood_pools(source_name, weights, pretrain, record_chars=record_chars, min_chars=min_chars,
                                  max_chars_per_source=max_chars_per_source, salt=salt)
    else:
        weights = {p: DEFAULT_WEIGHTS[p] for p in NON_MEMBER}
        pools = {p: [r for r in corpus.partitions[p] if r.source == source_name] for p in NON_MEMBER}
        if rel == "overlap":
            pools.update(_overlap_pools([r for r in pretrain if r.source == source_name], DEFAULT_WEIGHTS, salt))

    # Long n-gram filter, applied here for every relation (iid pools already pass it in build_corpus).
    pretrain_grams = _gram_index([r.text for r in pretrain])
    first_stage = NON_MEMBER if rel != "overlap" else _CHECKED
    for part in first_stage:
        recs = pools[part]
        flagged = _overlapping([r.text for r in recs], pretrain_grams)
        pools[part] = [r for r, bad in zip(recs, flagged.tolist()) if not bad]
    protected_grams = _gram_index([r.text for p in _PROTECTED for r in pools[p]])
    for part in _CHECKED:
        recs = pools[part]
        flagged = _overlapping([r.text for r in recs], protected_grams)
        pools[part] = [r for r, bad in zip(recs, flagged.tolist()) if not bad]

    partitions = {"pretrain": pretrain}
    for part in NON_MEMBER:
        partitions[part] = _order(pools[part], salt)
        if not partitions[part]:
            budget = "unlimited" if max_chars_per_source is None else str(max_chars_per_source)
            raise DataError(f"subset {subset!r} ({rel}): partition {part!r} is empty (source {source_name}, "
                            f"max_chars_per_source={budget}): use a larger max_chars_per_source or another salt")

    infos = {s.name: s for s in corpus.sources}
    sources = []
    for name in mixture:
        role = "pretrain+subset" if name == source_name else "pretrain"
        sources.append({**infos[name].to_dict(), "role": role})
    if source_name not in infos:
        sources.append({**get_source(source_name).info.to_dict(), "role": "subset"})

    params = {
        "pile_subsets_version": PILE_SUBSETS_VERSION,
        "corpus_version": CORPUS_VERSION,
        "subset": subset,
        "relation": rel,
        "source": source_name,
        "pretrain_sources": mixture,
        "source_versions": {s["name"]: s["version"] for s in sources},
        "weights": weights,
        "pretrain_weights": dict(corpus.params["weights"]),
        "record_chars": record_chars,
        "min_chars": min_chars,
        "max_chars_per_source": max_chars_per_source,
        "salt": salt,
        "ngram": NGRAM,
    }
    return SubsetCorpus(subset=subset, relation=rel, partitions=partitions, sources=sources, params=params)


# --------------------------------------------------------------------------- task


@register_task("pile_subset")
class PileSubset(Task):
    description = ("Offline mini-Pile subset (code, wiki, books, news, dialogue_en, dialogue_de): one shared "
                   "pretraining partition of the mixture, and held-out / population / adaptation / target pools "
                   "from the subset, iid (held out from a pretraining source), ood (a source outside the "
                   "mixture) or overlap (targets drawn from the pretraining partition itself).")
    #: 0.2.0: records keep their document, and worlds pool the adaptation and target partitions (bench/pools.py)
    version = "0.2.0"
    params = (
        Param("subset", str, "wiki", "which subset gives the non-pretrain pools", choices=tuple(SUBSETS)),
        Param("relation", str, "auto", "relation of the pools to pretraining; auto: iid if the subset's source "
              "is in pretrain_sources, else ood", choices=("auto",) + RELATIONS),
        Param("pretrain_sources", list, list(DEFAULT_PRETRAIN_SOURCES), "the shared pretraining mixture",
              item_type=str),
        Param("max_chars_per_source", int, 3_000_000, "deterministic per-source budget of characters", low=10_000),
        Param("record_chars", int, 320, "approximate characters per record", low=40),
        Param("min_chars", int, 120, "drop records shorter than this", low=1),
        Param("salt", str, "privbench-v1", "partition salt; changing it draws new partitions"),
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        # Fail at configuration time, not after minutes of building.
        mixture = list(dict.fromkeys(self.pretrain_sources))
        self.resolved_relation = resolve_relation(self.subset, self.relation, mixture)

    offline = True
    variant_param = "subset"
    record_unit = "text chunk <= {record_chars} chars"

    def relation_label(self) -> str:
        return self.resolved_relation

    def provenance(self) -> list[dict]:
        """The pool's own source first, then the rest of the pretraining mixture."""
        source = SUBSETS[self.subset]["source"]
        names = [source] + [n for n in dict.fromkeys(self.pretrain_sources) if n != source]
        return [get_source(name).info.to_dict() for name in names]

    def build(self, cache: ArtifactCache | None = None) -> TaskData:
        # the cache key lists the mixture first, then the pool's source (the order it always had)
        source = SUBSETS[self.subset]["source"]
        names = list(dict.fromkeys(self.pretrain_sources)) + ([source] if source not in self.pretrain_sources else [])
        provenance = [get_source(name).info.to_dict() for name in names]
        config = {**self.config, "relation": self.resolved_relation}
        key = content_hash("pile_subset", CACHE_SCHEMA, PILE_SUBSETS_VERSION, CORPUS_VERSION, CORPUS_LAYOUT, config,
                           provenance)

        def make(tmp: Path) -> None:
            built = build_subset(self.subset, relation=self.resolved_relation, pretrain_sources=self.pretrain_sources,
                                 max_chars_per_source=self.max_chars_per_source, record_chars=self.record_chars,
                                 min_chars=self.min_chars, salt=self.salt)
            parts = {name: [[r.id, r.text, r.source, f"{r.source}/{r.doc_id}"] for r in recs] for name, recs in built.partitions.items()}
            (tmp / "corpus.json").write_text(json.dumps({
                "partitions": parts, "fingerprint": built.fingerprint(), "stats": built.stats(),
                "sources": built.sources, "relation": built.relation}))

        cache = cache or ArtifactCache()
        path = cache.get_or_build("data", key, make)
        blob = json.loads((path / "corpus.json").read_text())
        return task_data_from_rows(f"{self.name}:{self.subset}", blob, relation=blob["relation"])
