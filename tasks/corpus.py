"""Build the privbench text corpus: sources -> documents -> partitions -> records.

The build is a pure function of its parameters and the installed source data:

1. Documents of each source (optionally a deterministic budgeted subset: the
   documents in a salted hash order of ``"<source>/<doc_id>"``, kept until
   ``max_chars_per_source`` characters are reached).  The order hash is
   ``stable_hash("subset", salt, key)``, domain-separated from the partition
   hash so that a budgeted subset still spans all partitions.
2. Each *document* is assigned to one partition with :func:`assign_partition`,
   so the chunks of a document never straddle two partitions.
3. Documents are chunked into records (:func:`chunk_text`); exact duplicates
   (by :func:`normalized_key`) are removed globally, keeping the first in
   partition order, then document key, then position.
4. Long n-gram overlap filter: a record of heldout/population/adapt/targets that
   shares a word 13-gram (lowercased, whitespace tokens) with the pretrain
   partition is dropped; then a heldout/population record sharing a 13-gram with
   the (filtered) adapt or targets partitions is dropped.
5. Records inside a partition are ordered by ``stable_hash(salt, record.id)``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from bench.errors import ConfigError, DataError
from bench.task import TargetRecord, TaskData
from tasks.partition import assign_partition, chunk_text, normalized_key, stable_hash
from tasks.sources import Document, SourceInfo, get_source

__all__ = [
    "Record",
    "Corpus",
    "PARTITIONS",
    "DEFAULT_WEIGHTS",
    "NGRAM",
    "CORPUS_VERSION",
    "CORPUS_LAYOUT",
    "build_corpus",
    "task_data_from_rows",
    "ngram_hashes",
]

PARTITIONS = ("pretrain", "heldout", "population", "adapt", "targets")
DEFAULT_WEIGHTS = {"pretrain": 0.6, "heldout": 0.08, "population": 0.16, "adapt": 0.08, "targets": 0.08}
NGRAM = 13
CORPUS_VERSION = 1  # bump when the build algorithm changes
#: how a cached corpus stores its records: ``[id, text, source, document]`` rows (the document lets a world split
#: its adaptation pool by document, bench.pools); part of the cache key, not of the corpus fingerprint
CORPUS_LAYOUT = "rows-with-document"

_SUBSET_DOMAIN = "subset"
_NON_MEMBER = ("heldout", "population", "adapt", "targets")
_SECOND_STAGE = ("heldout", "population")  # checked against adapt + targets


@dataclass(frozen=True)
class Record:
    id: str  # f"{source}-{sha1(text)[:12]}"
    text: str
    source: str
    doc_id: str


def record_id(source: str, text: str) -> str:
    return f"{source}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


@dataclass
class Corpus:
    partitions: dict[str, list[Record]]
    sources: list[SourceInfo]
    params: dict = field(default_factory=dict)

    def fingerprint(self) -> str:
        """sha256 over the build params and all record ids in partition order."""
        h = hashlib.sha256()
        h.update(json.dumps(self.params, sort_keys=True, separators=(",", ":")).encode("utf-8"))
        for name in PARTITIONS:
            h.update(b"\x1e" + name.encode("utf-8"))
            for rec in self.partitions.get(name, []):
                h.update(b"\x1f" + rec.id.encode("utf-8"))
        return h.hexdigest()

    def stats(self) -> dict:
        """Per partition: n_records, n_chars, n_docs, by_source {source: n_records}."""
        names = [s.name for s in self.sources]
        out: dict = {}
        for part in PARTITIONS:
            recs = self.partitions.get(part, [])
            by_source = {n: 0 for n in names}
            chars_by_source = {n: 0 for n in names}
            for rec in recs:
                by_source[rec.source] = by_source.get(rec.source, 0) + 1
                chars_by_source[rec.source] = chars_by_source.get(rec.source, 0) + len(rec.text)
            out[part] = {
                "n_records": len(recs),
                "n_chars": sum(len(r.text) for r in recs),
                "n_docs": len({(r.source, r.doc_id) for r in recs}),
                "by_source": by_source,
                "chars_by_source": chars_by_source,
            }
        return out

    def texts(self, partition: str) -> list[str]:
        if partition not in PARTITIONS:
            raise DataError(f"unknown partition {partition!r}: use one of {', '.join(PARTITIONS)}")
        return [r.text for r in self.partitions[partition]]


# --------------------------------------------------------------------------- n-grams

_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier for the rolling combine


class _TokenHasher:
    """Deterministic 64-bit token hashes (blake2b), cached per distinct token."""

    def __init__(self) -> None:
        self._cache: dict[str, int] = {}

    def __call__(self, token: str) -> int:
        value = self._cache.get(token)
        if value is None:
            value = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")
            self._cache[token] = value
        return value


def ngram_hashes(texts: Sequence[str], n: int = NGRAM, hasher: _TokenHasher | None = None) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every word n-gram of every text.

    Returns ``(hashes, owner)``: ``owner[k]`` is the index in ``texts`` of the
    text that contains n-gram ``k``. Tokens are ``text.lower().split()``;
    n-grams never span two texts. Texts with fewer than ``n`` tokens have none.
    """
    hasher = hasher or _TokenHasher()
    lengths = np.zeros(len(texts), dtype=np.int64)
    flat: list[int] = []
    for i, text in enumerate(texts):
        toks = text.lower().split()
        lengths[i] = len(toks)
        flat.extend(map(hasher, toks))
    total = len(flat)
    if total < n:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    tok = np.fromiter(flat, dtype=np.uint64, count=total)
    owner_tok = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
    width = total - n + 1
    h = np.zeros(width, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _MULT + tok[j : j + width]
    valid = owner_tok[:width] == owner_tok[n - 1 :]
    return h[valid], owner_tok[:width][valid]


def _flag_overlaps(hashes: np.ndarray, owner: np.ndarray, n_texts: int, reference: np.ndarray) -> np.ndarray:
    """Boolean per text: does it contain any n-gram hash in ``reference`` (sorted unique)?"""
    flagged = np.zeros(n_texts, dtype=bool)
    if hashes.size and reference.size:
        hit = np.isin(hashes, reference, assume_unique=False)
        flagged[owner[hit]] = True
    return flagged


# --------------------------------------------------------------------------- build


def _resolve_weights(weights: dict[str, float] | None) -> dict[str, float]:
    if weights is None:
        return dict(DEFAULT_WEIGHTS)
    unknown = sorted(set(weights) - set(PARTITIONS))
    missing = [p for p in PARTITIONS if p not in weights]
    if unknown or missing:
        raise ConfigError(
            f"corpus weights must name exactly the partitions {', '.join(PARTITIONS)}"
            f" (unknown: {unknown or 'none'}, missing: {missing or 'none'}): fix the weights"
        )
    out = {}
    for p in PARTITIONS:
        w = float(weights[p])
        if not (w > 0.0) or w == float("inf"):
            raise ConfigError(f"corpus weight {p}={weights[p]!r} is invalid: use a finite number > 0")
        out[p] = w
    return out


def _select_documents(docs: Iterable[Document], key_of, salt: str, budget: int | None) -> list[Document]:
    docs = list(docs)
    if budget is None:
        return docs
    # Domain-separated from assign_partition's stable_hash(salt, key): ordering by
    # the very same hash would fill a budget with the lowest partition ranges only.
    ordered = sorted(docs, key=lambda d: (stable_hash(_SUBSET_DOMAIN, salt, key_of(d)), key_of(d)))
    kept, used = [], 0
    for doc in ordered:
        if used >= budget:
            break
        kept.append(doc)
        used += len(doc.text)
    return kept


def build_corpus(
    source_names: Sequence[str] = ("stdlib_code", "shakespeare"),
    *,
    weights: dict[str, float] | None = None,
    record_chars: int = 320,
    min_chars: int = 120,
    max_chars_per_source: int | None = None,
    salt: str = "privbench-v1",
) -> Corpus:
    """Build the corpus (see the module docstring for the rules)."""
    if isinstance(source_names, str):
        source_names = (source_names,)
    source_names = list(dict.fromkeys(source_names))
    if not source_names:
        raise ConfigError("no text sources given: name at least one source, e.g. stdlib_code")
    if max_chars_per_source is not None and max_chars_per_source <= 0:
        raise ConfigError(f"max_chars_per_source={max_chars_per_source} is invalid: use a positive number or None")
    w = _resolve_weights(weights)
    sources = [get_source(name) for name in source_names]

    def key_of(doc: Document) -> str:
        return f"{doc.source}/{doc.doc_id}"

    # 1-3: select documents, partition them, chunk, collect candidates in dedup order.
    candidates: list[tuple[int, str, int, str, str, str]] = []  # (part_idx, key, pos, text, source, doc_id)
    part_index = {p: i for i, p in enumerate(PARTITIONS)}
    for src in sources:
        docs = _select_documents(src.documents(), key_of, salt, max_chars_per_source)
        for doc in docs:
            key = key_of(doc)
            part = assign_partition(key, salt, w)
            for pos, chunk in enumerate(chunk_text(doc.text, record_chars, min_chars)):
                candidates.append((part_index[part], key, pos, chunk, doc.source, doc.doc_id))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))

    seen: set[str] = set()
    records: list[Record] = []
    rec_part: list[int] = []
    for pidx, _key, _pos, text, source, doc_id in candidates:
        nk = normalized_key(text)
        if nk in seen:
            continue
        seen.add(nk)
        records.append(Record(id=record_id(source, text), text=text, source=source, doc_id=doc_id))
        rec_part.append(pidx)
    del candidates, seen

    # 4: long n-gram overlap filter.
    part_arr = np.asarray(rec_part, dtype=np.int64)
    hashes, owner = ngram_hashes([r.text for r in records])
    gram_part = part_arr[owner] if owner.size else owner
    keep = np.ones(len(records), dtype=bool)

    pretrain_grams = np.unique(hashes[gram_part == part_index["pretrain"]])
    nonmember = np.isin(part_arr, [part_index[p] for p in _NON_MEMBER])
    flagged = _flag_overlaps(hashes, owner, len(records), pretrain_grams)
    keep &= ~(flagged & nonmember)

    protected = np.isin(gram_part, [part_index["adapt"], part_index["targets"]]) & keep[owner]
    protected_grams = np.unique(hashes[protected])
    second = np.isin(part_arr, [part_index[p] for p in _SECOND_STAGE])
    flagged = _flag_overlaps(hashes, owner, len(records), protected_grams)
    keep &= ~(flagged & second)

    # 5: group, order deterministically, check non-empty.
    partitions: dict[str, list[Record]] = {p: [] for p in PARTITIONS}
    for rec, pidx, k in zip(records, rec_part, keep.tolist()):
        if k:
            partitions[PARTITIONS[pidx]].append(rec)
    for p in PARTITIONS:
        partitions[p].sort(key=lambda r: (stable_hash(salt, r.id), r.id))
        if not partitions[p]:
            budget = "unlimited" if max_chars_per_source is None else str(max_chars_per_source)
            raise DataError(
                f"corpus partition {p!r} is empty (sources {', '.join(source_names)}, "
                f"max_chars_per_source={budget}): use a larger max_chars_per_source or more sources"
            )

    params = {
        "corpus_version": CORPUS_VERSION,
        "source_names": list(source_names),
        "source_versions": {s.info.name: s.info.version for s in sources},
        "weights": w,
        "record_chars": record_chars,
        "min_chars": min_chars,
        "max_chars_per_source": max_chars_per_source,
        "salt": salt,
        "ngram": NGRAM,
    }
    return Corpus(partitions=partitions, sources=[s.info for s in sources], params=params)


def task_data_from_rows(name: str, blob: dict, **extra) -> TaskData:
    """The :class:`bench.task.TaskData` of a cached corpus (``corpus.json``: partitions of ``[id, text, source,
    document]`` rows, fingerprint, stats, sources), each adaptation and target record with its document."""
    p = blob["partitions"]
    return TaskData(
        name=name,
        pretrain=tuple(r[1] for r in p["pretrain"]),
        heldout=tuple(r[1] for r in p["heldout"]),
        population=tuple(r[1] for r in p["population"]),
        adapt=tuple(r[1] for r in p["adapt"]),
        adapt_docs=tuple(r[3] for r in p["adapt"]),
        targets=tuple(TargetRecord(r[0], r[1]) for r in p["targets"]),
        target_docs=tuple(r[3] for r in p["targets"]),
        fingerprint=blob["fingerprint"],
        sources=tuple(blob["sources"]),
        stats=blob["stats"],
        **extra,
    )
