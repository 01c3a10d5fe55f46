"""Deduplication of the pretraining corpus (Kandpal et al. 2022; Lee et al. 2022), named by Segal et al. 2025
as an empirical mitigation: repeated documents are memorized far more, so removing repeats removes much of it.

Runs on the corpus *after* the challenger's inserts (it receives one list, in content-hash order, with nothing
marking the inserts), so the repeated copies of a=1 targets (``pretrain_target_repeats`` > 1) are among what it
removes. Two passes, in the order given, first occurrence kept:

* exact: documents equal after lower-casing and collapsing whitespace;
* near: a document whose word ``ngram``-grams are at least ``near_threshold`` already in kept documents.

Deviation: Lee et al. find near duplicates with MinHash (Jaccard of 5-grams) and repeated substrings with a
suffix array (ExactSubstr, 50 tokens) and cut the substring; here a whole document goes when most of its long
word n-grams were seen (containment, exact set lookup; the corpora here are small), and shorter documents are
only deduplicated exactly.
"""

from __future__ import annotations

import hashlib
import re

from bench.defense import Adapted, Filtered
from bench.errors import ConfigError
from bench.params import Param
from bench.registry import register_defense
from defenses.finetune import ADAPT_PARAMS, FineTune

_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text.lower()).strip()


def _ngrams(words: list[str], n: int) -> set[bytes]:
    return {hashlib.blake2b(" ".join(words[i:i + n]).encode(), digest_size=8).digest()
            for i in range(len(words) - n + 1)}


def dedup_texts(texts: list[str], ngram: int = 13, near_threshold: float = 0.5) -> tuple[list[int], dict]:
    """Indices of the documents kept (first occurrences) and counts of what was removed."""
    if ngram < 1 or not 0.0 < near_threshold <= 1.0:
        raise ConfigError("dedup: ngram must be >= 1 and near_threshold in (0, 1]")
    seen_exact: set[bytes] = set()
    seen_grams: set[bytes] = set()
    keep: list[int] = []
    exact = near = 0
    for i, t in enumerate(texts):
        norm = _norm(t)
        h = hashlib.blake2b(norm.encode(), digest_size=16).digest()
        if h in seen_exact:
            exact += 1
            continue
        grams = _ngrams(norm.split(" "), ngram)
        if grams and len(grams & seen_grams) >= near_threshold * len(grams):
            near += 1
            continue
        seen_exact.add(h)
        seen_grams |= grams
        keep.append(i)
    return keep, {"exact_removed": exact, "near_removed": near, "kept": len(keep)}


@register_defense("dedup")
class Dedup(FineTune):
    description = ("Exact and near-duplicate (long word n-gram) removal from the pretraining corpus after the "
                   "challenger's inserts; then plain fine-tuning (of the adaptation data deduplicated the same "
                   "way with adapt_dedup).")
    stages = frozenset({"pretrain", "adapt"})
    params = ADAPT_PARAMS + (
        Param("ngram", int, 13, "words per n-gram of the near-duplicate test", low=1),
        Param("near_threshold", float, 0.5, "share of a document's n-grams already seen that makes it a near "
              "duplicate", low=0.0, high=1.0, low_inclusive=False),
        Param("adapt_dedup", bool, False, "also deduplicate the adaptation data before fine-tuning"),
    )
    code_modules = ("defenses.finetune",)

    def pretrain_texts(self, docs: list[str]) -> Filtered:
        keep, counts = dedup_texts(docs, self.ngram, self.near_threshold)
        return Filtered([docs[i] for i in keep], counts)

    def adapt(self, model, data, ctx):
        """Plain fine-tuning; with ``adapt_dedup``, on the adaptation records that survive :func:`dedup_texts` in
        the order given: the first copy of a repeated record stays, its repeats go (a canary inserted r times is
        trained on once), and so does a record most of whose long n-grams an earlier one holds."""
        if not self.adapt_dedup:
            return super().adapt(model, data, ctx)
        texts = list(data.texts)
        keep, counts = dedup_texts(texts, self.ngram, self.near_threshold)
        model = self.finetune(model, [texts[i] for i in keep], ctx, desc="adapt: dedup")
        self._report["adapt_dedup"] = {"records_in": len(texts), **counts}
        return Adapted(model, self.training_report())
