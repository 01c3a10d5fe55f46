"""The one language-model API that attacks, defenses' releases and utility evaluation use.

Everything an attacker touches is a :class:`LanguageModel`: a Hugging Face
model, a released checkpoint, or an aggregating defense over several models.
Capabilities are explicit; :class:`RestrictedModel` exposes only those a
threat model allows and nothing else (no weights, no training data).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from bench.errors import CapabilityError
from bench.hashing import content_hash, text_hash
from bench.logit_stats import stats_from_logits, stats_from_logprobs
from bench.signals import TokenSignals, load_signals, save_signals

TOKEN_LOGPROBS = "token_logprobs"
NEXT_TOKEN_DISTRIBUTION = "next_token_distribution"
GENERATE = "generate"
REFERENCE_MODEL = "reference_model"
SHADOW_MODELS = "shadow_models"
POPULATION = "population"
USER_SAMPLES = "user_samples"
#: the attacker may fine-tune a copy of its calibration model (θ where released, else its own reference model) on
#: texts of its choosing with the public recipe (e.g. Self-prompt's reference); see bench/attacker_models.py
FINETUNE_REFERENCE = "finetune_reference"
MODEL_CAPABILITIES = frozenset({TOKEN_LOGPROBS, NEXT_TOKEN_DISTRIBUTION, GENERATE})
ALL_CAPABILITIES = MODEL_CAPABILITIES | {REFERENCE_MODEL, SHADOW_MODELS, POPULATION, USER_SAMPLES,
                                         FINETUNE_REFERENCE}



def right_padded(seqs: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of token sequences, right-padded with ``pad``, and its attention mask, on ``device``."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad, dtype=np.int64)  # filled in numpy: one tensor per row costs more
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = s
        mask[r, : len(s)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def left_padded(seqs: list[list[int]], pad: int, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded batch (the last position is every row's prediction point), its mask and position ids."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, width - len(s):] = torch.tensor(s)
        mask[r, width - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids.to(device), mask.to(device), pos.to(device)


def generation_rows(batch_size: int, max_length: int, length: int, max_new_tokens: int) -> int:
    """Rows per greedy-generation batch: :data:`GENERATE_BATCH_FACTOR` times a scoring batch's tokens
    (``batch_size`` × ``max_length``) over the sequence length (prompt plus new tokens)."""
    return max(1, GENERATE_BATCH_FACTOR * max(int(batch_size), 1) * max_length // (length + max_new_tokens))


def length_sorted_batches(lengths: Sequence[int], rows_at: Callable[[int], int]) -> list[list[int]]:
    """Indices into ``lengths``, sorted by length (stable, so equal lengths keep their order) and cut into
    consecutive batches, each holding as many rows as ``rows_at(length)`` allows at its longest (last) entry."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batches and len(batches[-1]) < max(1, rows_at(lengths[i])):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def scoring_batches(order: Sequence[int], lengths: Sequence[int], batch_size: int, max_tokens: int
                    ) -> list[list[int]]:
    """``order`` (longest first) in chunks of ``batch_size`` rows, consecutive chunks of the same padded length
    joined while the joined batch stays within ``max_tokens`` tokens.

    Every row is padded to the length it has in its ``batch_size`` chunk, as in one forward pass per chunk; only
    the number of rows per forward pass grows. That is what makes short texts (canaries, Names2IDs records, exposure
    references of a few tokens) cheap: eight 9-token rows are too little work to amortise a forward pass."""
    batches: list[list[int]] = []
    width = -1  # the padded length of the last batch
    for start in range(0, len(order), batch_size):
        chunk = list(order[start:start + batch_size])
        longest = max(lengths[i] for i in chunk)
        if batches and longest == width and (len(batches[-1]) + len(chunk)) * longest <= max_tokens:
            batches[-1].extend(chunk)
        else:
            batches.append(chunk)
            width = longest
    return batches


def signals_from_logprobs(logp: torch.Tensor, tgt: torch.Tensor, spans: Sequence[slice]) -> list[TokenSignals]:
    """Per-token signals of a batch from its next-token log-distributions ``logp`` (fp32, batch × T × V).

    ``tgt[r, j]`` is the token position ``j`` predicts; ``spans[r]`` keeps row ``r``'s own tokens. μ and σ² of
    log p under the model's distribution use the centred form E[(log p − μ)²], which avoids cancellation when
    the distribution is near-uniform (bench/logit_stats.py). Shared by every LanguageModel that computes
    distributions itself.
    """
    return signals_from_stats(stats_from_logprobs(logp, tgt), tgt, spans)


def signals_from_stats(stats: tuple[torch.Tensor, ...], tgt: torch.Tensor, spans: Sequence[slice]
                       ) -> list[TokenSignals]:
    """Split per-position statistics (bench.logit_stats: log p, μ, σ², top-1, top-1 log p) into rows.

    Each statistic crosses to the host once per batch and is cut into rows there: cutting on the device first
    costs six device-to-host copies (and synchronisations) per row."""
    return signals_from_host(stats_to_host(stats, tgt), spans)


class HostStats(NamedTuple):
    """A batch's statistics on their way to the host: the copies may still be in flight until ``ready``."""
    arrays: tuple[torch.Tensor, ...]  # log p, μ, σ² (clamped at 0), top-1, top-1 log p, targets: CPU tensors
    ready: torch.cuda.Event | None  # recorded after the copies on a CUDA stream; None where they were synchronous


def stats_to_host(stats: tuple[torch.Tensor, ...], tgt: torch.Tensor) -> HostStats:
    """Start the copy of a batch's statistics and targets to the host without waiting for it.

    From a GPU the copies go to pinned memory asynchronously, so the scoring loop can queue the next batch's
    forward pass before it waits for them: the card computes batch i + 1 while the host cuts batch i into rows
    (:func:`signals_from_host`). On a CPU the copies are no-ops and nothing changes."""
    tok_lp, mu, sigma2, top1, top1_lp = stats
    tensors = (tok_lp, mu, sigma2.clamp_min(0), top1, top1_lp, tgt)
    if tgt.device.type != "cuda":
        return HostStats(tuple(x.cpu() for x in tensors), None)
    arrays = tuple(x.to("cpu", non_blocking=True) for x in tensors)  # pinned destinations, asynchronous copies
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(tgt.device))
    return HostStats(arrays, ready)


def signals_from_host(staged: HostStats, spans: Sequence[slice]) -> list[TokenSignals]:
    """Cut a batch's host copies (:func:`stats_to_host`) into one :class:`TokenSignals` per row, once they
    have arrived."""
    if staged.ready is not None:
        staged.ready.synchronize()
    tok_lp, mu, sigma2, top1, top1_lp, ids = (x.numpy() for x in staged.arrays)
    return [TokenSignals(token_ids=ids[r, sl].astype(np.int32),
                         logprobs=tok_lp[r, sl].astype(np.float32),
                         mu=mu[r, sl].astype(np.float32),
                         sigma2=sigma2[r, sl].astype(np.float32),
                         top1=top1[r, sl].astype(np.int8),
                         top1_logprob=top1_lp[r, sl].astype(np.float32))
            for r, sl in enumerate(spans)]


class LanguageModel(ABC):
    """A causal language model as seen from outside: signals, next-token distributions, generation."""

    __slots__ = ()
    #: content hash identifying the model's behaviour (weights + tokenizer + scoring settings)
    fingerprint: str
    capabilities: frozenset[str] = MODEL_CAPABILITIES

    @abstractmethod
    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        """Per-token log-probs and per-position mean/variance of log p, one entry per text.

        With ``prefix``, each text is scored conditioned on it (``prefix`` then the text);
        only the text's tokens are returned, in the same positions as without a prefix
        (a text too long for the context keeps its first tokens).
        """

    @abstractmethod
    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        """Log-probabilities over the vocabulary of the token after each prefix, shape (n, vocab)."""

    @abstractmethod
    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations (the new text only)."""

    def split_at_token(self, text: str, n_tokens: int) -> tuple[str, str]:
        """``text`` cut after its first ``n_tokens`` tokens (no BOS, no truncation): (head, tail), each decoded
        as :meth:`generate` decodes; ``n_tokens`` past the end gives ``(text, "")``."""
        raise CapabilityError(f"{type(self).__name__} cannot cut text at token boundaries: implement split_at_token")

    def nll(self, texts: Sequence[str]) -> np.ndarray:
        """Mean per-token negative log-likelihood of each text."""
        return np.array([s.nll() for s in self.token_signals(texts)], dtype=np.float64)

    def with_private_cache(self) -> LanguageModel:
        """This model answering from a fresh in-memory cache of its own, neither reading nor adding to the one it
        shares: a submitted attack's calls are served this way, so how fast a call comes back cannot tell one
        game what another game's queries were (bench/plugin_worker.py). A model without a cache is returned as
        it is."""
        if not hasattr(self, "_cache"):
            return self
        import copy
        twin = copy.copy(self)
        twin._cache = SignalCache(None)
        return twin


def _load_generations(shard: Path) -> dict[str, str]:
    """A generation shard: a JSON object of generation key -> continuation (anything else is refused)."""
    data = json.loads(shard.read_text(encoding="utf-8"))
    if not (isinstance(data, dict) and all(isinstance(v, str) for v in data.values())):
        raise ValueError(f"{shard.name} is not a generation shard")
    return data


class SignalCache:
    """Disk cache of :class:`TokenSignals`, keyed by (model fingerprint, text hash).

    One directory per model; each scoring call that computes new texts adds one
    shard, written to a unique temporary name, checksummed and renamed into place
    (bench/signals.py), so a killed run or a concurrent writer never leaves a shard
    that a reader trusts. A lookup that misses re-scans the directory for shards
    other processes (Ray workers) added since, before anything is recomputed.

    ``read_only`` roots (the shared cache's ``signals`` under a sandboxed submission, see
    :class:`bench.cache.OverlayCache`) are read as well and never written: new shards go to ``root`` only, and
    a corrupt shard there is skipped rather than deleted.

    With a ``store`` (:class:`bench.artifact_store.ArtifactStore`: nodes without a shared disk), every shard
    written here is uploaded too, and a scan first downloads the store's shards of the model that ``root`` lacks.
    """

    def __init__(self, root: Path | None, read_only: Sequence[Path] = (), *, store=None) -> None:
        self.root = root
        self.store = store if root is not None else None
        self.read_only = tuple(Path(r) for r in read_only)
        self._mem: dict[str, dict[str, TokenSignals]] = {}
        self._gen: dict[str, dict[str, str]] = {}
        self._seen: dict[str, set[str]] = {}

    @classmethod
    def for_cache(cls, cache) -> SignalCache:
        """The signal cache of an artifact cache: ``<root>/signals``, plus its read-only roots' ``signals``."""
        return cls(cache.root / "signals", [r / "signals" for r in getattr(cache, "read_only_roots", ())],
                   store=getattr(cache, "store", None))

    def _pull(self, fp: str) -> None:
        """Download the store's shards of model ``fp`` that this node's directory lacks (no-op without a store)."""
        if self.store is None:
            return
        d = self.root / fp
        have = {p.name for p in d.iterdir()} if d.is_dir() else set()
        for name in self.store.shard_names(fp):
            if name not in have:
                self.store.download_shard(fp, name, d)

    def _push(self, fp: str, shard: Path) -> None:
        if self.store is not None:
            self.store.upload_shard(fp, shard)

    def _read_shards(self, fp: str, pattern: str, seen: set[str], load, table: dict) -> None:
        """Add every shard of model ``fp`` matching ``pattern`` not read before (read-only roots first, then our
        own); a shard ``load`` refuses is never trusted: deleted from our root, skipped in a read-only one."""
        roots = [(r, False) for r in self.read_only] + ([(self.root, True)] if self.root is not None else [])
        for root, own in roots:
            if not (root / fp).is_dir():
                continue
            for shard in sorted((root / fp).glob(pattern)):
                if str(shard) in seen:
                    continue
                try:
                    table.update(load(shard))
                except Exception:  # a corrupt shard is recomputed, never trusted
                    if own:
                        shard.unlink(missing_ok=True)
                        continue
                seen.add(str(shard))  # read, or not ours to delete: skipped from now on

    def _scan(self, fp: str) -> None:
        self._pull(fp)
        self._read_shards(fp, "*.npz", self._seen.setdefault(fp, set()), load_signals, self._mem.setdefault(fp, {}))

    def _load(self, fp: str) -> dict[str, TokenSignals]:
        if fp not in self._mem:
            self._scan(fp)
        return self._mem[fp]

    def lookup(self, fp: str, keys: Sequence[str]) -> dict[str, TokenSignals]:
        table = self._load(fp)
        if any(k not in table for k in keys):
            self._scan(fp)
        return {k: table[k] for k in keys if k in table}

    # -- greedy generations: deterministic for a model, so cached like signals (JSON shards, never pickle) ----
    def _gen_table(self, fp: str) -> dict[str, str]:
        key = f"gen:{fp}"
        table = self._gen.setdefault(key, {})
        self._pull(fp)
        self._read_shards(fp, "gen-*.json", self._seen.setdefault(key, set()), _load_generations, table)
        return table

    def lookup_generations(self, fp: str, keys: Sequence[str]) -> dict[str, str]:
        """Stored greedy continuations of model ``fp`` by generation key (prompt hash and length)."""
        table = self._gen.get(f"gen:{fp}") or self._gen_table(fp)
        if any(k not in table for k in keys):
            table = self._gen_table(fp)
        return {k: table[k] for k in keys if k in table}

    def add_generations(self, fp: str, new: dict[str, str]) -> None:
        if not new:
            return
        self._gen.setdefault(f"gen:{fp}", {}).update(new)
        if self.root is None:
            return
        import os
        import tempfile
        d = self.root / fp
        d.mkdir(parents=True, exist_ok=True)
        name = f"gen-{content_hash(sorted(new))}.json"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=d)
        os.close(fd)
        try:
            Path(tmp).write_text(json.dumps(new, sort_keys=True), encoding="utf-8")
            os.replace(tmp, d / name)  # write-then-rename: a killed run leaves no half-written shard
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._seen.setdefault(f"gen:{fp}", set()).add(str(d / name))
        self._push(fp, d / name)

    def add(self, fp: str, new: dict[str, TokenSignals]) -> None:
        if not new:
            return
        self._load(fp).update(new)
        if self.root is None:
            return
        import os
        import tempfile
        d = self.root / fp
        d.mkdir(parents=True, exist_ok=True)
        keys = sorted(new)
        name = f"{content_hash(keys)}.npz"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=d)  # unique: writers never share it
        os.close(fd)
        try:
            save_signals(Path(tmp), keys, [new[k] for k in keys])
            os.replace(tmp, d / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._seen.setdefault(fp, set()).add(str(d / name))
        self._push(fp, d / name)


class HFLanguageModel(LanguageModel):
    """A Hugging Face causal LM with batched, length-sorted scoring and a signal cache."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, fingerprint: str, max_length: int = 128,
                 batch_size: int = 32, device: torch.device | None = None, autocast_bf16: bool = False,
                 add_bos: bool = True, cache: SignalCache | None = None, progress: bool = False,
                 exact_fingerprint: bool = False) -> None:
        self._model = model.eval()
        self._tok = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self._generation_cap: int | None = None  # rows per generation batch that fitted after a CUDA OOM
        self.device = device or next(model.parameters()).device
        self.autocast_bf16 = autocast_bf16
        self.add_bos = add_bos and tokenizer.bos_token_id is not None
        self._cache = cache or SignalCache(None)
        self.progress = progress
        # exact: the caller's fingerprint already names artifact and scoring settings (bench/keys.py, the runner)
        self.fingerprint = fingerprint if exact_fingerprint else self.fingerprint_for(
            fingerprint, max_length=max_length, add_bos=self.add_bos, autocast_bf16=autocast_bf16)

    @staticmethod
    def fingerprint_for(key: str, *, max_length: int, add_bos: bool, autocast_bf16: bool = False) -> str:
        """The fingerprint of a handle built from a bare key: the key with the scoring settings that change its
        signals (the runner instead passes bench.keys.scoring_fingerprint with ``exact_fingerprint``)."""
        from bench.hashing import module_hash
        return content_hash({"model": key, "max_length": max_length, "bos": add_bos, "bf16": autocast_bf16,
                             "code": module_hash("bench.lm", "bench.signals", "bench.logit_stats")})

    # -- tokenisation ----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]`` in one tokenizer call: a fast tokenizer encodes a list in parallel,
        which on a GPU is the difference between feeding the card and waiting on the host."""
        if not texts:
            return []
        bos = [self._tok.bos_token_id] if self.add_bos else []
        return [(bos + ids)[: self.max_length] for ids in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    @property
    def tokenizer(self):
        return self._tok

    def _autocast(self):
        if self.autocast_bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return torch.autocast(self.device.type, enabled=False)

    # -- signals ---------------------------------------------------------------------------------
    def encode_with_prefix(self, prefix: str, text: str) -> tuple[list[int], int]:
        """BOS + prefix + text ids and the index where the text starts; the prefix is cut from the left."""
        p = self._tok(prefix, add_special_tokens=False)["input_ids"]
        t = self._tok(text, add_special_tokens=False)["input_ids"]
        bos = [self._tok.bos_token_id] if self.add_bos else []
        room = self.max_length - len(bos) - len(t)
        min_prefix = min(len(p), self.max_length // 4)  # never let a long text push the prefix out entirely
        keep = max(room, min_prefix)
        p = p[len(p) - keep:] if keep < len(p) else p
        ids = (bos + p + t)[: self.max_length]
        return ids, len(bos) + len(p)

    def split_at_token(self, text: str, n_tokens: int) -> tuple[str, str]:
        ids = self._tok(text, add_special_tokens=False)["input_ids"]
        n = max(0, min(int(n_tokens), len(ids)))
        return (self._tok.decode(ids[:n], skip_special_tokens=True),
                self._tok.decode(ids[n:], skip_special_tokens=True))

    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        keys = [text_hash(t) if prefix is None else text_hash(f"{text_hash(prefix)}\x1f{t}") for t in texts]
        have = self._cache.lookup(self.fingerprint, keys)
        todo = {k: t for k, t in zip(keys, texts) if k not in have}
        if todo:
            computed = self._compute_signals(list(todo.keys()), list(todo.values()), prefix)
            self._cache.add(self.fingerprint, computed)
            have.update(computed)
        return [have[k] for k in keys]

    @torch.no_grad()
    def _compute_signals(self, keys: list[str], texts: list[str], prefix: str | None = None
                         ) -> dict[str, TokenSignals]:
        if prefix is None:
            encoded, starts = self.encode_many(texts), [1] * len(texts)
        else:
            pairs = [self.encode_with_prefix(prefix, t) for t in texts]
            encoded, starts = [e for e, _ in pairs], [s for _, s in pairs]
        order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))  # length-sorted batches waste no padding
        pad = self._tok.pad_token_id if self._tok.pad_token_id is not None else 0
        from bench.device import run_with_oom_backoff
        return run_with_oom_backoff(lambda bs: self._score_batches(order, encoded, starts, keys, pad, bs),
                                    self.batch_size, self.device, on_shrink=self._remember_batch_size)

    def _remember_batch_size(self, batch_size: int) -> None:
        """The largest batch that fitted: later calls start from it instead of running out of memory again.
        Only a CUDA out-of-memory error shrinks it, so CPU runs (and their stored scores) never see a change."""
        self.batch_size = batch_size

    def _score_batches(self, order: list[int], encoded: list[list[int]], starts: list[int], keys: list[str],
                       pad: int, batch_size: int) -> dict[str, TokenSignals]:
        out: dict[str, TokenSignals] = {}
        batches = scoring_batches(order, [len(e) for e in encoded], batch_size, batch_size * self.max_length)
        it = batches
        if self.progress and len(batches) > 4:
            it = tqdm(batches, desc="scoring", unit="batch", leave=False)
        pending: tuple[list[int], list[slice], HostStats] | None = None

        def finish(batch: list[int], spans: list[slice], staged: HostStats) -> None:
            for i, sig in zip(batch, signals_from_host(staged, spans)):
                out[keys[i]] = sig

        for batch in it:  # batch i's rows are cut on the host after batch i + 1 is queued on the device
            ids, mask = right_padded([encoded[i] for i in batch], pad, self.device)
            with self._autocast():
                logits = self._model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            # position j of the shifted arrays predicts token j+1; keep the text's tokens only
            spans = [slice(max(starts[i] - 1, 0), len(encoded[i]) - 1) for i in batch]
            staged = stats_to_host(stats_from_logits(logits[:, :-1], ids[:, 1:]), ids[:, 1:])
            del logits
            if pending is not None:
                finish(*pending)
            pending = (batch, spans, staged)
        if pending is not None:
            finish(*pending)
        return out

    @torch.no_grad()
    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        rows = []
        for start in range(0, len(prefixes), self.batch_size):
            chunk = [self.encode(p) for p in prefixes[start:start + self.batch_size]]
            ids, mask, pos = left_padded(chunk, self._tok.pad_token_id or 0, self.device)
            with self._autocast():
                logits = self._model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
            rows.append(torch.log_softmax(logits[:, -1].float(), -1).cpu().numpy())
        return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations, cached by (fingerprint, prompt, length) in the signal cache, so a rerun or another
        attack generates nothing twice.

        Prompts are sorted by token length and generated together in left-padded batches (as many rows as
        :data:`GENERATE_BATCH_FACTOR` times the scoring batch's tokens allow at the batch's longest prompt; sorting
        keeps the padding to a token or two per row). A sequence that ends early is padded with the pad token, and
        each row is cut after its first EOS, so the padding never shows.

        A batch of one row (an unbatched call) and of many rows use different kernels, and a left-padded row sums
        its attention over masked positions too; both move fp32 logits by up to about 2e-4 (docs/benchmarks.md),
        and only a step whose top two logits are that close can pick another token. So a batched row whose
        top-1/top-2 gap falls below :data:`GREEDY_TIE_MARGIN` at some step (a close call) is generated again on its
        own through its last close call, and the continuation is the one-prompt-at-a-time one whatever the batch
        size or its neighbours' lengths (tests/test_generation_batched.py). Where the prompt alone agrees with the
        batched row through that step, the batched row's later steps stand, exactly as every step of a row without
        a close call stands; where it picks another token, it goes on alone to the end. Under bf16 autocast
        (opt-in, CUDA) rounding is coarser than the margin, so there a near-tied choice may still flip
        (docs/determinism.md)."""
        keys = [content_hash(text_hash(p), max_new_tokens) for p in prompts]
        have = self._cache.lookup_generations(self.fingerprint, keys)
        todo: dict[str, list[int]] = {}
        for p, k in zip(prompts, keys):
            if k not in have and k not in todo:
                todo[k] = self.encode(p)
        pending = list(todo)
        batches = length_sorted_batches([len(todo[k]) for k in pending],
                                        lambda length: self._generation_rows(length, max_new_tokens))
        new: dict[str, str] = {}
        bar = tqdm(total=len(todo), desc="generating", unit="prompt", disable=not self.progress or len(todo) < 8)
        from bench.device import run_with_oom_backoff
        for batch in ([pending[i] for i in b] for b in batches):
            def run(bs: int, batch: list[str] = batch) -> None:
                self._generate_batch(batch, todo, max_new_tokens, bs, new, bar)
            rows = min(len(batch), self._generation_cap or len(batch))  # a back-off seen earlier holds
            run_with_oom_backoff(run, rows, self.device, on_shrink=self._remember_generation_rows)
        bar.close()
        self._cache.add_generations(self.fingerprint, new)
        have.update(new)
        return [have[k] for k in keys]

    def _generation_rows(self, length: int, max_new_tokens: int) -> int:
        """Rows per generation batch (:func:`generation_rows`), capped by a CUDA out-of-memory back-off seen
        earlier."""
        rows = generation_rows(self.batch_size, self.max_length, length, max_new_tokens)
        return min(rows, self._generation_cap) if self._generation_cap is not None else rows

    def _remember_generation_rows(self, rows: int) -> None:
        """A generation batch of ``rows`` was the largest that fitted (CUDA only): later batches start there."""
        self._generation_cap = rows

    def _generate_batch(self, batch: list[str], encoded: dict[str, list[int]], max_new_tokens: int,
                        batch_size: int, out: dict[str, str], bar) -> None:
        """Greedy continuations of the prompts ``batch`` (keys into ``encoded``), ``batch_size`` rows at a time;
        rows already in ``out`` (before an out-of-memory retry) are not generated again."""
        eos = self._eos_ids()
        for start in range(0, len(batch), batch_size):
            chunk = [k for k in batch[start:start + batch_size] if k not in out]
            if not chunk:
                continue
            ids, mask, _ = left_padded([encoded[k] for k in chunk], self._tok.pad_token_id, self.device)
            gaps = _TopTwoGap() if len(chunk) > 1 else None
            gen = self._greedy(ids, mask, max_new_tokens, gaps)
            gap = torch.stack(gaps.steps, 1).cpu() if gaps is not None and gaps.steps else None
            width = ids.shape[1]
            for r, (row, k) in enumerate(zip(gen[:, width:].tolist(), chunk)):
                stop = next((j for j, t in enumerate(row) if t in eos), None)
                row = row if stop is None else row[:stop + 1]
                close = (gap[r, :len(row)] < GREEDY_TIE_MARGIN).nonzero() if gap is not None and row else []
                if len(close):  # batching could flip a close call: the prompt alone decides
                    row = self._decide_alone(encoded[k], row, int(close[-1]), max_new_tokens)
                out[k] = self._tok.decode(row, skip_special_tokens=True)
            bar.update(len(chunk))

    def _decide_alone(self, prompt: list[int], batched: list[int], last_close: int, max_new_tokens: int
                      ) -> list[int]:
        """The continuation of ``prompt`` generated on its own through step ``last_close``, the batched row's last
        close call: where the two agree up to there, the batched row's later steps stand (each cleared the margin,
        as every step of a row that never went back did); where the prompt alone picked another token, it goes on
        alone to the end."""
        ids = torch.tensor([prompt], device=self.device)
        alone = self._greedy(ids, torch.ones_like(ids), max_new_tokens,
                             stop=_AgreesThrough(batched, last_close, ids.shape[1]))[0, ids.shape[1]:].tolist()
        return batched if alone == batched[:len(alone)] else alone

    def _greedy(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
                gaps: _TopTwoGap | None = None, stop=None) -> torch.Tensor:
        """Hugging Face greedy generation from left-padded ``ids`` and their attention ``mask`` (the model derives
        each row's position ids from it), optionally recording the top-two gaps or with a stopping criterion."""
        from transformers import LogitsProcessorList, StoppingCriteriaList
        with self._autocast():
            return self._model.generate(input_ids=ids, attention_mask=mask,
                                        max_new_tokens=max_new_tokens, do_sample=False,
                                        pad_token_id=self._tok.pad_token_id,
                                        logits_processor=LogitsProcessorList([gaps] if gaps is not None else []),
                                        stopping_criteria=StoppingCriteriaList([stop] if stop is not None else []))

    def _eos_ids(self) -> set[int]:
        """The token ids that end a greedy continuation (the model's generation config, as ``generate`` uses)."""
        eos = getattr(getattr(self._model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            return set()
        return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


#: a generation batch holds this many times the tokens of a scoring batch (batch_size × max_length): it keeps
#: one row of logits per prompt, not one per position (SmolLM2-135M, 400 PII prompts, 2 CPU cores: 5.6 prompts/s
#: with the scoring batch's 8 rows, 8.6 with this budget, same texts; scripts/bench_generation_rows.py)
GENERATE_BATCH_FACTOR = 4

#: a batched greedy row whose top two logits come closer than this at some step is generated again on its own
#: through that step (HFLanguageModel.generate): 6× the largest logit shift batching caused on SmolLM2-135M
#: (1.6e-4, scripts/generation_tie_margin.py), and small enough that few rows of a trained model go back (42 and
#: 55 of 400 on the realistic track's fine-tuned and LoRA models; nano trained 2 epochs: 13 of 256)
GREEDY_TIE_MARGIN = 1e-3


class _TopTwoGap:
    """Logits processor that leaves the scores as they are and records each row's top-1 minus top-2 logit."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = scores.topk(2, dim=-1).values.float()
        self.steps.append(top[:, 0] - top[:, 1])
        return scores


class _AgreesThrough:
    """Stopping criterion for a row generated alone: stop once it has passed step ``last_close`` still agreeing
    with the ``batched`` continuation (then the batched row's remaining steps are the answer)."""

    def __init__(self, batched: list[int], last_close: int, prompt_length: int) -> None:
        self.batched, self.last_close, self.prompt_length = batched, last_close, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        new = input_ids[0, self.prompt_length:].tolist()
        done = len(new) > self.last_close and new == self.batched[:len(new)]
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class RestrictedModel(LanguageModel):
    """A view of a model that exposes only the capabilities a threat model releases.

    It holds the wrapped model in a closure, not an attribute, so the handle has
    no attribute leading to weights or training data, and it never holds labels.
    (In-process Python is not a security boundary: `privbench submit` runs a
    submitted plugin in worker processes apart from the labels, whose calls
    come back to this handle; docs/attacks.md.)
    """

    __slots__ = ("fingerprint", "capabilities", "_call", "role", "_private")

    def __init__(self, model: LanguageModel, capabilities: frozenset[str], role: str) -> None:
        allowed = frozenset(capabilities) & MODEL_CAPABILITIES
        object.__setattr__(self, "_private", lambda: RestrictedModel(model.with_private_cache(), allowed, role))

        def call(method: str, *args):
            caps = {"token_signals": (TOKEN_LOGPROBS,), "next_token_logprobs": (NEXT_TOKEN_DISTRIBUTION,),
                    "generate": (GENERATE,), "split_at_token": (GENERATE, NEXT_TOKEN_DISTRIBUTION)}[method]
            if not allowed.intersection(caps):
                raise CapabilityError(f"the {role} model does not release '{caps[0]}' in this game: "
                                      f"declare it in the attack's `requires` or use another game")
            return getattr(model, method)(*args)

        object.__setattr__(self, "_call", call)
        object.__setattr__(self, "fingerprint", model.fingerprint)
        object.__setattr__(self, "capabilities", allowed)
        object.__setattr__(self, "role", role)

    def __setattr__(self, name, value):
        raise AttributeError("released model handles are read-only")

    def __delattr__(self, name):
        raise AttributeError("released model handles are read-only")

    def with_private_cache(self) -> RestrictedModel:
        """The same handle over :meth:`LanguageModel.with_private_cache` of the wrapped model."""
        return self._private()

    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        return self._call("token_signals", list(texts), prefix)

    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        return self._call("next_token_logprobs", list(prefixes))

    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        return self._call("generate", list(prompts), max_new_tokens)

    def split_at_token(self, text: str, n_tokens: int) -> tuple[str, str]:
        return self._call("split_at_token", text, int(n_tokens))
