"""Deterministic test doubles: a real (if tiny) language model and synthetic task data.

``UnigramLM`` is a legitimate :class:`bench.lm.LanguageModel`: a byte-level
unigram model with add-one smoothing, fitted on some texts. Its log-probs are
real, so every built-in attack runs on it without torch or training, and a
text it was fitted on really is more likely under it than one it was not.

``make_task_data`` builds a :class:`bench.task.TaskData` of synthetic, unique
texts. Each text is written in its own small "alphabet" (a seeded random subset
of characters), so its byte distribution is distinctive enough that fitting a
unigram model on it leaves a measurable membership signal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from bench.lm import LanguageModel
from bench.signals import TokenSignals
from bench.task import TargetRecord, TaskData

VOCAB_SIZE = 256  # bytes

# Characters the synthetic texts are made of: ASCII letters plus a few 2-byte UTF-8 letters.
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéèàüößçñ"


class UnigramLM(LanguageModel):
    """Byte-level unigram LM: p(b) = (count(b) + 1) / (N + 256), independent of context."""

    def __init__(self, texts: Iterable[str] = (), *, name: str = "unigram") -> None:
        counts = np.ones(VOCAB_SIZE, dtype=np.float64)  # add-one smoothing
        for t in texts:
            counts += np.bincount(np.frombuffer(t.encode("utf-8"), dtype=np.uint8), minlength=VOCAB_SIZE)
        self.logp = np.log(counts / counts.sum())
        p = np.exp(self.logp)
        self.mu = float((p * self.logp).sum())
        self.sigma2 = float(max((p * self.logp ** 2).sum() - self.mu ** 2, 0.0))
        self.argmax = int(np.argmax(self.logp))
        self.fingerprint = hashlib.sha256(name.encode() + counts.tobytes()).hexdigest()[:16]
        self.calls: list[tuple[str, int]] = []  # (method, number of inputs): lets tests see what was asked

    @staticmethod
    def encode(text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        # a unigram model ignores context, so a prefix changes nothing
        texts = list(texts)
        self.calls.append(("token_signals", len(texts)))
        out = []
        for t in texts:
            ids = self.encode(t)
            n = ids.shape[0]
            out.append(TokenSignals(
                token_ids=ids,
                logprobs=self.logp[ids].astype(np.float32),
                mu=np.full(n, self.mu, dtype=np.float32),
                sigma2=np.full(n, self.sigma2, dtype=np.float32),
                top1=(ids == self.argmax).astype(np.int8),
            ))
        return out

    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        prefixes = list(prefixes)
        self.calls.append(("next_token_logprobs", len(prefixes)))
        return np.tile(self.logp.astype(np.float32), (len(prefixes), 1))

    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        prompts = list(prompts)
        self.calls.append(("generate", len(prompts)))
        return [bytes([self.argmax] * max_new_tokens).decode("utf-8", errors="replace") for _ in prompts]


def _text(rng: np.random.Generator, n_words: int) -> str:
    letters = rng.choice(len(ALPHABET), size=int(rng.integers(5, 9)), replace=False)
    alphabet = [ALPHABET[i] for i in letters]
    words = ["".join(rng.choice(alphabet, size=int(rng.integers(2, 8)))) for _ in range(n_words)]
    return " ".join(words)


def make_texts(n: int, *, seed: int, n_words: int = 12, exclude: set[str] | None = None) -> list[str]:
    """``n`` distinct synthetic texts, deterministic in ``seed``, none of them in ``exclude``."""
    rng = np.random.default_rng(seed)
    seen = set(exclude or ())
    out: list[str] = []
    while len(out) < n:
        t = _text(rng, n_words)
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def make_task_data(n_targets: int = 400, n_adapt: int = 200, n_pretrain: int = 100, n_heldout: int = 50,
                   n_population: int = 100, *, seed: int = 0, name: str = "synthetic") -> TaskData:
    """A TaskData whose partitions are disjoint and whose every text is unique across all partitions."""
    sizes = {"pretrain": n_pretrain, "heldout": n_heldout, "population": n_population, "adapt": n_adapt,
             "targets": n_targets}
    texts = make_texts(sum(sizes.values()), seed=seed)
    parts: dict[str, list[str]] = {}
    start = 0
    for key, n in sizes.items():
        parts[key] = texts[start:start + n]
        start += n
    targets = tuple(TargetRecord(f"rec-{i:05d}", t) for i, t in enumerate(parts["targets"]))
    fp = hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:16]
    return TaskData(name=name, pretrain=tuple(parts["pretrain"]), heldout=tuple(parts["heldout"]),
                    population=tuple(parts["population"]), adapt=tuple(parts["adapt"]), targets=targets,
                    fingerprint=fp)


class NgramLM(LanguageModel):
    """Byte-level n-gram LM with add-α smoothing: it memorises the texts it was fitted on, as an overfitted network
    does, so membership in its training data is strongly visible (where a unigram model averages it away)."""

    def __init__(self, texts: Iterable[str] = (), *, n: int = 4, alpha: float = 0.05, name: str = "ngram") -> None:
        from collections import Counter, defaultdict
        self.n, self.alpha = n, alpha
        self.counts: dict[bytes, Counter] = defaultdict(Counter)
        h = hashlib.sha256(f"{name}|{n}|{alpha}".encode())
        for t in texts:
            ids = UnigramLM.encode(t)
            h.update(t.encode("utf-8") + b"\x1e")
            for i in range(len(ids)):
                self.counts[bytes(ids[max(0, i - n + 1):i].astype(np.uint8))][int(ids[i])] += 1
        self.fingerprint = h.hexdigest()[:16]
        self._dist: dict[bytes, np.ndarray] = {}

    def _logp(self, context: bytes) -> np.ndarray:
        if context not in self._dist:
            v = np.full(VOCAB_SIZE, self.alpha)
            for b, k in self.counts.get(context, {}).items():
                v[b] += k
            self._dist[context] = np.log(v / v.sum())
        return self._dist[context]

    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        out = []
        for t in texts:
            ids = UnigramLM.encode(t)
            dists = [self._logp(bytes(ids[max(0, i - self.n + 1):i].astype(np.uint8))) for i in range(len(ids))]
            lp = np.array([d[b] for d, b in zip(dists, ids)], dtype=np.float32)
            mu = np.array([(np.exp(d) * d).sum() for d in dists], dtype=np.float32)
            var = np.array([max((np.exp(d) * d ** 2).sum() - m ** 2, 0.0) for d, m in zip(dists, mu)],
                           dtype=np.float32)
            top1 = np.array([int(np.argmax(d)) == b for d, b in zip(dists, ids)], dtype=np.int8)
            out.append(TokenSignals(token_ids=ids, logprobs=lp, mu=mu, sigma2=var, top1=top1))
        return out

    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        rows = []
        for p in prefixes:
            ids = UnigramLM.encode(p)
            rows.append(self._logp(bytes(ids[max(0, len(ids) - self.n + 1):].astype(np.uint8))))
        return np.asarray(rows, dtype=np.float32)

    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        out = []
        for p in prompts:
            new = b""
            for _ in range(max_new_tokens):
                new += bytes([int(np.argmax(self._logp((p.encode("utf-8") + new)[-(self.n - 1):] if self.n > 1
                                                       else b"")))])
            out.append(new.decode("utf-8", errors="replace"))
        return out
