"""Audit canaries of Panda, Tang, Nasr, Choquette-Choo and Mittal 2025 ("Privacy Auditing of Large Language Models").

A canary is an in-distribution prefix followed by a short *secret* of ``secret_tokens`` tokens chosen so that the
model finds it very unlikely before training; membership is scored by the loss of the secret tokens alone, given
the prefix (attack ``secret_loss``). The designs differ only in how the secret's tokens are chosen:

* ``new_token``: tokens the model never saw. Panda et al. add new tokens to the vocabulary (their embeddings start
  at zero) and build each canary's secret from its own new tokens;
* ``unigram``: tokens drawn at random among the rarest tokens of the fine-tuning data (tokens that occur, with a
  count at most the smallest threshold leaving ``n_canaries × secret_tokens`` of them);
* ``bigram``: a model-free design from the fine-tuning data's bigram statistics: the first token x runs through
  the rarest tokens of the data (ascending count), the second token y is the one least likely to follow x
  (smallest bigram count, among the rarest tokens as second element), and the secret repeats the pair (x y)
  ``secret_tokens / 2`` times;
* ``random``: the baseline of random tokens, drawn uniformly among the tokens that occur in the fine-tuning data.

The tokens are tokens of the world's tokenizer: the byte-level BPE that privbench trains on the pretraining
partition for its scratch models (:func:`bench.artifacts.ensure_tokenizer`; ``vocab_size`` 8192 for nano, micro and
mini). The task trains (or finds in the artifact cache) that same tokenizer, so a canary's secret is exactly the
token sequence it was designed as; with another model (a Hugging Face checkpoint, another ``vocab_size``) the
canaries stay valid records but their secrets are not the designed tokens.

Deviations from Panda et al., forced by the setting:

* New tokens cannot be added: the tokenizer is a content-keyed artifact shared by every task on the same
  pretraining partition, and adding tokens would change its key (and every cached model and result built on it).
  ``new_token`` therefore uses the closest faithful construction: tokens of the existing vocabulary that never
  occur when the whole pretraining partition is tokenized, nor in the fine-tuning data (BPE merges that later
  merges absorb, such as ``elf`` inside ``self``, and the byte tokens of control characters absent from the
  corpus). Their input embeddings were never trained; as outputs the softmax only pushed them down. Panda et al.
  start new embeddings at zero; ours keep their random initialisation.
* Panda et al. train canaries with the loss on the secret only (supervised fine-tuning); privbench's adaptation
  defenses train on whole records, so the prefix is trained too. Scoring still uses the secret only.
* The in-distribution prefix is the first ``prefix_tokens`` tokens of a ``mini_pile`` target record (never in
  pretraining, the same distribution as the adaptation data), followed by a line break (:data:`SEPARATOR`) that
  marks where the secret starts, so an attacker can split a canary from its text alone.
* Secrets are kept only if they tokenize back to the designed tokens, alone and after their prefix (byte-level BPE
  can merge across a boundary); candidates that do not are skipped. Tokens containing whitespace (other than a
  leading space), NUL or an incomplete UTF-8 sequence are never used, and neither are special tokens.
* Ties between equally rare tokens are broken by a seeded hash (Panda et al. do not say); with ``reuse: false``
  (the default) no token serves two canaries (``bigram``: no first token and no second token twice), so a
  non-member's secret shares no token with a member's.

Defaults: the never-seen tokens run short as the corpus grows (more text reaches more of the vocabulary): with
``max_chars_per_source`` 600 000 (this task's default; ``mini_pile``'s is 3 000 000) about 670 usable tokens occur
neither in the pretraining partition nor in the fine-tuning data, against about 200 at 3 000 000. The defaults
(256 canaries of 2 tokens: 512 distinct tokens) therefore build for every design; more canaries or longer secrets
need a smaller corpus or ``reuse: true`` (which lets a non-member share tokens with members).

Members and non-members are built the same way, before the challenger draws who goes into the data: which canary
is a member is independent of its design.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.errors import ConfigError, DataError
from bench.hashing import content_hash
from bench.params import Param
from bench.registry import register_task
from bench.task import TargetRecord, Task, TaskData
from tasks.derived import derived_fingerprint, partition_stats
from tasks.mini_pile import MiniPile, OnMiniPile

__all__ = ["DESIGNS", "SEPARATOR", "AuditCanaries", "split_secret", "usable_tokens", "token_counts",
           "world_tokenizer"]

DESIGNS = ("new_token", "unigram", "bigram", "random")
#: between the in-distribution prefix and the secret; never part of a secret
SEPARATOR = "\n"


def _rng(*parts: Any) -> np.random.Generator:
    return np.random.default_rng(int(content_hash("privbench-audit-canaries", *parts, length=16), 16))


def _tie(seed: int, token_id: int) -> str:
    return hashlib.sha256(f"{seed}\x1f{token_id}".encode()).hexdigest()


# ------------------------------------------------------------------------------------------ tokenizer

def world_tokenizer(base: TaskData, vocab_size: int, cache=None):
    """The byte-level BPE privbench's scratch models of ``vocab_size`` use on ``base``'s pretraining partition,
    and its artifact key (the runner's tokenizer job finds the same artifact)."""
    from transformers import AutoTokenizer

    from bench.artifacts import ensure_tokenizer, tokenizer_key
    from bench.cache import ArtifactCache
    from bench.modeling import ModelSpec

    spec = ModelSpec("audit-canaries", vocab_size=vocab_size)
    tmp = None
    if cache is None:
        tmp = tempfile.mkdtemp(prefix="privbench-tok-")
        cache = ArtifactCache(Path(tmp))
    try:
        path, key = ensure_tokenizer(cache, spec, base)
        tok = AutoTokenizer.from_pretrained(path)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    assert key == tokenizer_key(spec, base)
    return tok, key


def token_counts(tok, texts: Sequence[str]) -> np.ndarray:
    """Occurrences of every token id when each text is tokenized on its own (no special tokens)."""
    counts = np.zeros(len(tok), dtype=np.int64)
    texts = list(texts)
    for start in range(0, len(texts), 512):
        for ids in tok(texts[start:start + 512], add_special_tokens=False)["input_ids"]:
            np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    return counts


def bigram_counts(tok, texts: Sequence[str]) -> Counter:
    """Occurrences of every adjacent token pair (x, y) within a text."""
    c: Counter = Counter()
    texts = list(texts)
    for start in range(0, len(texts), 512):
        for ids in tok(texts[start:start + 512], add_special_tokens=False)["input_ids"]:
            c.update(zip(ids[:-1], ids[1:]))
    return c


def usable_tokens(tok) -> dict[int, str]:
    """Token id -> its text, for tokens a secret may use: not special, text that tokenizes back to the token alone,
    no incomplete UTF-8 sequence, no NUL and no whitespace other than one leading space."""
    special = set(tok.all_special_ids)
    out: dict[int, str] = {}
    for i in range(len(tok)):
        if i in special:
            continue
        s = tok.decode([i])
        body = s[1:] if s.startswith(" ") else s
        if not body or "\ufffd" in s or "\x00" in s or any(c.isspace() for c in body):
            continue
        if tok(s, add_special_tokens=False)["input_ids"] == [i]:
            out[i] = s
    return out


def _threshold_pool(counts: np.ndarray, candidates: Iterable[int], need: int, seed: int) -> list[int]:
    """The rarest ``candidates`` that occur (count > 0): every token with a count at most the smallest threshold
    that leaves at least ``need`` of them (Panda et al.'s upper frequency threshold), rarest first."""
    occurring = sorted((i for i in candidates if counts[i] > 0), key=lambda i: (int(counts[i]), _tie(seed, i)))
    if len(occurring) < need:
        return occurring
    cut = int(counts[occurring[need - 1]])
    return [i for i in occurring if counts[i] <= cut]


# ------------------------------------------------------------------------------------------ splitting

def split_secret(public_format: dict[str, Any] | None, text: str) -> tuple[str | None, str]:
    """(context, secret) of a target from the public format alone: the loss of ``secret`` given ``context`` is the
    membership score of ``secret_loss``. ``context`` is None when the secret starts the text.

    * audit canaries (``prefix_secret``): the prefix with its separator, and what follows the last separator;
    * random-word canaries (``random_words``): the template's fixed words before the first placeholder, and the rest
      (with the space before the first word, which byte-level BPE attaches to that word);
    * canary prefixes (``canary_prefix``, Marek et al. 2026): the random prefix is the secret, scored alone;
    * secret carriers (``secrets``, Ganesh et al. 2025): the text before the secret in its template line, and the
      secret (:func:`tasks.secrets.find_secret`, from the public templates and formats);
    * anything else (ordinary records): no context; the whole record is the secret.
    """
    fmt = public_format or {}
    kind = fmt.get("kind")
    if kind == "prefix_secret":
        sep = fmt["separator"]
        head, found, secret = text.rpartition(sep)
        if found and secret:
            return head + sep, secret
    elif kind == "random_words":
        template = fmt["template"]
        start = min(template.index(f) for f in ("{w1}", "{w2}", "{w3}"))
        # the whitespace before the first word goes with the secret: byte-level BPE attaches a leading space to
        # the word after it, so the secret is then scored as the tokens it was trained as
        head = template[:start].rstrip()
        if head and text.startswith(head) and len(text) > len(head):
            return head, text[len(head):]
    elif kind == "canary_prefix":
        from tasks.canaries import split_canary
        prefix, _ = split_canary(fmt, text)
        return None, prefix
    elif kind == "secrets":
        from tasks.secrets import find_secret
        span = find_secret(fmt, text)
        if span is not None:
            start, end = span
            if start > 0 and text[start - 1] == " ":  # the space goes with the secret, as BPE trained it
                start -= 1
            return text[:start], text[start:end]
    return None, text


# ------------------------------------------------------------------------------------------ the task

def _base_task(config: dict[str, Any]) -> MiniPile:
    return MiniPile(**{p.name: config[p.name] for p in MiniPile.params})


class _Builder:
    """Checks that a secret tokenizes back to its designed tokens, alone and after its prefix."""

    def __init__(self, tok, surfaces: dict[int, str]) -> None:
        self.tok, self.surfaces = tok, surfaces

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def fits(self, head_ids: list[int], head: str, secret: list[int]) -> bool:
        s = "".join(self.surfaces[i] for i in secret)
        return self.ids(s) == secret and self.ids(head + s) == head_ids + secret


@register_task("audit_canaries")
class AuditCanaries(OnMiniPile, Task):
    offline = True
    variant_param = "design"
    record_unit = "{prefix_tokens}-token mini_pile prefix + {secret_tokens}-token secret"
    description = ("Audit canaries of Panda et al. 2025: an in-distribution prefix and a secret of new (never seen), "
                   "rare (unigram), bigram-unlikely or random tokens of the world's tokenizer; scored by the loss of "
                   "the secret (attack secret_loss).")
    version = "0.1.0"
    params = (
        Param("design", str, "new_token", "how the secret's tokens are chosen: new_token (never in pretraining or "
              "the fine-tuning data), unigram (rarest in the fine-tuning data), bigram (rare x, least likely y "
              "after x, repeated) or random", choices=DESIGNS),
        Param("n_canaries", int, 256, "canaries in the target pool (at most the mini_pile target records)", low=8),
        Param("secret_tokens", int, 2, "tokens of each secret (bigram: even, the pair repeated)", low=1, high=32),
        Param("prefix_tokens", int, 32, "tokens of the in-distribution prefix (the start of a mini_pile target "
              "record)", low=1, high=96),
        Param("reuse", bool, False, "let a token serve several canaries (false: each token at most one canary)"),
        Param("vocab_size", int, 8192, "vocabulary of the scratch byte-level BPE the secrets are designed for (the "
              "nano, micro and mini models: 8192)", low=512),
        Param("seed", int, 0, "seed of the prefixes, the token draws and the tie-breaks"),
    ) + tuple(dataclasses.replace(p, default=600_000) if p.name == "max_chars_per_source" else p
              for p in MiniPile.params)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.design == "bigram" and self.secret_tokens % 2:
            raise ConfigError(f"task 'audit_canaries': design 'bigram' repeats a token pair, so secret_tokens must "
                              f"be even (got {self.secret_tokens}): use {self.secret_tokens + 1} or "
                              f"{max(2, self.secret_tokens - 1)}")

    def _fail(self, what: str) -> DataError:
        fix = "lower n_canaries or secret_tokens" + ("" if self.reuse else ", or set reuse: true")
        return DataError(f"task 'audit_canaries' (design '{self.design}'): {what}: {fix}")

    def build(self, cache=None) -> TaskData:
        base = _base_task(self.config).build(cache)
        records = list(base.targets)
        if len(records) < self.n_canaries:
            raise DataError(f"task 'audit_canaries': n_canaries is {self.n_canaries} but mini_pile has only "
                            f"{len(records)} target records to take prefixes from: lower n_canaries or raise "
                            f"max_chars_per_source")
        tok, tok_key = world_tokenizer(base, self.vocab_size, cache)
        b = _Builder(tok, usable_tokens(tok))
        # prefixes: the first prefix_tokens tokens of mini_pile target records, in a seeded order
        order = _rng("prefixes", self.seed, base.fingerprint).permutation(len(records))
        prefixes: list[tuple[str, str]] = []
        for i in order.tolist():
            ids = b.ids(records[i].text)
            if len(ids) < self.prefix_tokens:
                continue
            text = tok.decode(ids[:self.prefix_tokens]).rstrip()
            if text and "\ufffd" not in text:
                prefixes.append((records[i].id, text))
            if len(prefixes) == self.n_canaries:
                break
        if len(prefixes) < self.n_canaries:
            raise DataError(f"task 'audit_canaries': only {len(prefixes)} mini_pile target records have "
                            f"{self.prefix_tokens} tokens: lower n_canaries or prefix_tokens, or raise "
                            f"max_chars_per_source")
        # the fine-tuning data before canaries: the adaptation pool and the records the prefixes come from
        finetune = list(base.adapt) + [t for _, t in prefixes]
        counts = token_counts(tok, finetune)
        need = self.n_canaries * self.secret_tokens
        info: dict[str, Any] = {}
        if self.design == "bigram":
            secrets = self._bigram(b, tok, finetune, counts, prefixes, info)
        else:
            if self.design == "new_token":
                pretrain = token_counts(tok, base.pretrain)
                pool = sorted(i for i in b.surfaces if pretrain[i] == 0 and counts[i] == 0)
            elif self.design == "unigram":
                pool = _threshold_pool(counts, b.surfaces, need, self.seed)
                info["max_count"] = int(max((counts[i] for i in pool), default=0))
            else:
                pool = sorted(i for i in b.surfaces if counts[i] > 0)
            if not self.reuse and len(pool) < need:
                raise self._fail(f"{need} distinct tokens are needed but the pool has {len(pool)}")
            secrets = self._draw(b, pool, prefixes)
            info["pool_size"] = len(pool)
        public_format = {
            "kind": "prefix_secret", "design": self.design, "separator": SEPARATOR,
            "secret_tokens": self.secret_tokens, "prefix_tokens": self.prefix_tokens,
            "tokenizer": {"key": tok_key, "vocab_size": self.vocab_size},
        }
        targets: list[TargetRecord] = []
        meta: dict[str, dict[str, Any]] = {}
        for (cid, prefix), secret in zip(prefixes, secrets):
            secret_text = "".join(b.surfaces[i] for i in secret)
            rid = f"audit-{self.design}-{cid}"
            targets.append(TargetRecord(rid, prefix + SEPARATOR + secret_text))
            meta[rid] = {"prefix": prefix, "secret": secret_text, "secret_ids": list(secret), "design": self.design,
                         "carrier_id": cid}
        fingerprint = derived_fingerprint({"name": self.name, "config": self.config, "base": base.fingerprint,
                                           "public_format": public_format}, targets, base.adapt, base.population)
        stats = partition_stats(pretrain=base.pretrain, heldout=base.heldout, population=base.population,
                                 adapt=base.adapt, targets=[t.text for t in targets])
        used = Counter(i for s in secrets for i in set(s))  # token -> canaries whose secret holds it
        stats["canaries"] = dict(info, design=self.design, tokenizer=tok_key, distinct_tokens=len(used),
                                 max_canaries_per_token=max(used.values()))
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=base.heldout, population=base.population,
            adapt=base.adapt, targets=tuple(targets), fingerprint=fingerprint, sources=base.sources, stats=stats,
            relation=base.relation, unit="record", target_meta=meta, public_format=public_format,
        )

    def _draw(self, b: _Builder, pool: list[int], prefixes: list[tuple[str, str]]) -> list[list[int]]:
        """Each canary's secret, token by token, from ``pool`` (without reuse: each token at most once overall)."""
        available = set(pool)
        secrets = []
        for cid, prefix in prefixes:
            head = prefix + SEPARATOR
            head_ids = b.ids(head)
            rng = _rng("secret", self.seed, self.design, cid)
            secret: list[int] = []
            for _ in range(self.secret_tokens):
                cands = sorted(available) if not self.reuse else pool
                for j in rng.permutation(len(cands)).tolist():
                    if b.fits(head_ids, head, secret + [cands[j]]):
                        secret.append(cands[j])
                        break
                else:
                    raise self._fail(f"no token of the pool ({len(available)} left) extends a secret of canary "
                                     f"{len(secrets) + 1} so that it tokenizes back to itself")
                if not self.reuse:
                    available.discard(secret[-1])
            secrets.append(secret)
        return secrets

    def _bigram(self, b: _Builder, tok, finetune: list[str], counts: np.ndarray, prefixes: list[tuple[str, str]],
                info: dict[str, Any]) -> list[list[int]]:
        """(x y) pairs: x through the rarest first tokens, y the least likely second token after x."""
        pairs = bigram_counts(tok, finetune)
        left = np.zeros(len(tok), dtype=np.int64)
        right = np.zeros(len(tok), dtype=np.int64)
        for (x, y), n in pairs.items():
            left[x] += n
            right[y] += n
        n = self.n_canaries
        xs = _threshold_pool(left, b.surfaces, n, self.seed)
        ys = _threshold_pool(right, b.surfaces, n, self.seed + 1)
        info.update(pool_size=len(xs), second_pool_size=len(ys))
        if not self.reuse and (len(xs) < n or len(ys) < n):
            raise self._fail(f"{n} distinct first and second tokens are needed but the pools have {len(xs)} and "
                             f"{len(ys)}")
        used: set[int] = set()  # without reuse: tokens of earlier canaries, as first or second token
        secrets: list[list[int]] = []
        reps = self.secret_tokens // 2
        x_iter = iter(xs)
        for cid, prefix in prefixes:
            head = prefix + SEPARATOR
            head_ids = b.ids(head)
            for x in x_iter:
                if not self.reuse and x in used:
                    continue
                cands = sorted((y for y in ys if y != x and (self.reuse or y not in used)),
                               key=lambda y: (pairs.get((x, y), 0), _tie(self.seed, y)))
                y = next((y for y in cands if b.fits(head_ids, head, [x, y] * reps)), None)
                if y is not None:
                    break
            else:
                raise self._fail(f"the first-token pool ran out after {len(secrets)} canaries")
            used.update((x, y))
            secrets.append([x, y] * reps)
        return secrets
