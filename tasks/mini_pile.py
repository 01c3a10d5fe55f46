"""The embedded default task: an offline mini-Pile of real code (Python stdlib) and prose (Shakespeare).

Partitions are document-level and hash-based (see :mod:`tasks.corpus`), so a
record's membership never depends on file order, and no non-member shares a
long n-gram with pretraining. The built corpus is cached by content key.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bench.cache import ArtifactCache
from bench.hashing import CACHE_SCHEMA, content_hash, module_hash
from bench.params import Param
from bench.registry import register_task
from bench.task import Task, TaskData
from tasks.corpus import CORPUS_LAYOUT, CORPUS_VERSION, build_corpus, task_data_from_rows
from tasks.sources import get_source

#: offline sources an ``adapt_domain`` draws its pools from (tasks/pile_subsets.py)
SUBSET_SOURCES = {"wiki": "wikipedia", "news": "news"}


class OnMiniPile:
    """For tasks built on ``mini_pile`` (their parameters include its own): its sources and relation are theirs."""

    def provenance(self) -> list[dict]:
        return MiniPile(**{p.name: self.config[p.name] for p in MiniPile.params}).provenance()

    def relation_label(self) -> str:
        return "ood" if self.config.get("adapt_domain") else "iid"


@register_task("mini_pile")
class MiniPile(OnMiniPile, Task):
    description = ("Offline mini-Pile: Python standard library code and Shakespeare's plays, partitioned by "
                   "document into pretraining, held-out, attacker population, adaptation and target pools; with "
                   "adapt_domain, every pool but pretraining comes from a domain pretraining did not cover.")
    #: 0.2.0: records keep their document, and worlds pool the adaptation and target partitions (bench/pools.py)
    version = "0.2.0"
    params = (
        Param("sources", list, ["stdlib_code", "shakespeare"], "text sources to mix", item_type=str),
        Param("max_chars_per_source", int, 3_000_000, "deterministic per-source budget of characters", low=10_000),
        Param("record_chars", int, 320, "approximate characters per record", low=40),
        Param("min_chars", int, 120, "drop records shorter than this", low=1),
        Param("salt", str, "privbench-v1", "partition salt; changing it draws new partitions"),
        Param("adapt_domain", str, None, "draw held-out, population, adaptation and target pools from this offline "
              "source outside the pretraining mixture (wiki: Wikipedia prose, news), so adaptation has something to "
              "learn; null = every pool from the mixture", nullable=True, choices=("wiki", "news")),
    )

    offline = True
    record_unit = "text chunk <= {record_chars} chars"

    def provenance(self) -> list[dict]:
        names = list(self.sources) + ([SUBSET_SOURCES[self.adapt_domain]] if self.adapt_domain else [])
        return [get_source(name).info.to_dict() for name in names]

    def build(self, cache: ArtifactCache | None = None) -> TaskData:
        if self.adapt_domain is not None:
            return self._build_domain(cache)
        provenance = self.provenance()
        key = content_hash("mini_pile", CACHE_SCHEMA, CORPUS_VERSION, CORPUS_LAYOUT, self.config, provenance,
                           module_hash("tasks.corpus", "tasks.sources", "tasks.partition"))

        def make(tmp: Path) -> None:
            corpus = build_corpus(tuple(self.sources), record_chars=self.record_chars, min_chars=self.min_chars,
                                  max_chars_per_source=self.max_chars_per_source, salt=self.salt)
            parts = {name: [[r.id, r.text, r.source, f"{r.source}/{r.doc_id}"] for r in recs] for name, recs in corpus.partitions.items()}
            (tmp / "corpus.json").write_text(json.dumps({"partitions": parts, "fingerprint": corpus.fingerprint(),
                                                         "stats": corpus.stats(),
                                                         "sources": [s.to_dict() for s in corpus.sources]}))

        cache = cache or ArtifactCache()
        path = cache.get_or_build("data", key, make)
        blob = json.loads((path / "corpus.json").read_text())
        return task_data_from_rows(self.name, blob)

    def _build_domain(self, cache: ArtifactCache | None) -> TaskData:
        """Pretraining on the mixture, every other pool from ``adapt_domain`` (an ``ood`` pile_subset).

        Why: adapting a model on the mixture it was pretrained on teaches it little (the undefended fine-tune made
        held-out loss worse), so a privacy-utility trade-off cannot be measured; a domain pretraining did not cover
        gives adaptation something to learn, and utility is measured on held-out records of that same domain.
        """
        from tasks.pile_subsets import PileSubset
        if SUBSET_SOURCES[self.adapt_domain] in self.sources:
            from bench.errors import ConfigError
            raise ConfigError(f"task 'mini_pile': adapt_domain {self.adapt_domain!r} is also a pretraining source "
                              f"({', '.join(self.sources)}): remove it from sources or choose another domain")
        data = PileSubset(subset=self.adapt_domain, relation="ood", pretrain_sources=list(self.sources),
                          max_chars_per_source=self.max_chars_per_source, record_chars=self.record_chars,
                          min_chars=self.min_chars, salt=self.salt).build(cache)
        return dataclasses.replace(data, name=self.name)
