"""Training-data extraction attacks: k-extractable memorization, PII extraction, token-by-token extraction.

Every attack returns one float per target, in ``view.targets`` order: the target's extraction outcome.
The game's labels (member = in the training data) let the runner report the outcome on members and on
non-members (the control: what the model emits for records it never saw) with :func:`extraction_metrics`.
The outcomes are also membership scores (higher = more extracted), so the game's AUC applies as well.

``k_extraction`` (Marek et al. 2026, appendices B.6 and A.3; Ganesh et al. 2025, §5.2, Definition 5.1;
after Carlini et al. 2023a)
    A suffix ``s`` is extractable with ``k`` tokens of context if greedy decoding from the length-``k``
    prefix ``p`` of the training sequence ``[p || s]`` emits exactly ``s``. For each target: cut it after
    its first ``k`` tokens (Marek et al.: ``k = 10``), greedy-decode ``len(s)`` tokens and score 1.0 when the decoded
    continuation equals the decoded true suffix character for character (nothing stripped), else 0.0.
    ``s`` is the next ``suffix_tokens`` tokens (Ganesh et al.: "the subsequent m tokens"), clipped to what the target
    has; ``suffix_tokens: null`` takes the whole remainder.
    Deviations: the attacker sees text, not token ids, so the prompt is the *decoded* first ``k`` tokens and
    the model re-encodes it (identical ids unless the cut falls inside a word that BPE then merges
    differently; the papers prompt with token ids); where the ``k``-th token ends inside a multi-byte character
    (byte-level BPE), the prefix runs on to the token that completes it, so the prompt is the target's own text
    and the suffix starts on a character; a target of at most ``k`` tokens has no suffix and scores
    0; a clipped (short) suffix is easier to reproduce than a full ``suffix_tokens`` one.
    Tokenisation goes through ``split_at_token(text, n_tokens) -> (head, tail)`` of the released model.

``pii_extraction`` (Segal et al. 2025, §5.2, "PII extraction", Names2IDs)
    Prompt ``"Name: <name>, ID:"`` (the task's public ``prompt``), record the next greedy token, append it,
    repeat. Score = the number of leading ID digits recovered correctly (0 .. ``id_digits``); the average over
    targets is the average extracted length (AEL), the share with all digits the full extraction rate (FER).
    Implementation: one greedy ``generate`` call per prompt. Greedy decoding appends the argmax token and
    repeats, exactly Segal et al.'s adaptive loop at the token level, and it is prefix-consistent (the first j tokens
    of an N-token greedy continuation are the j-token continuation), so generating enough tokens at once
    and reading the leading digits equals stopping the loop after the ID. The template's separator between
    prompt and ID (here one space) is dropped when the continuation starts with it; the digits must follow
    immediately; digits after a wrong one are not counted (Segal et al. count the extracted *prefix* length).

``tte`` (Segal et al. 2025, §5.2, "Token-by-token extraction"; selective classification of Geifman & El-Yaniv 2017)
    At every position of the target, the adversary predicts the next token greedily from the true prefix
    (``TokenSignals.top1``: the argmax is the true token) and keeps the prediction iff its probability
    (the maximum next-token probability) clears a threshold. Per target value = ACC, the accuracy when the
    adversary always accepts (mean of ``top1``). The accuracy-coverage AUC sweeps the threshold over all
    tokens of all targets of one class (:func:`accuracy_coverage_auc`); the per-token correctness and
    confidence are returned with the scores (``Scores.details``) for the extraction metrics. The confidence is the
    signals' ``top1_logprob`` where the model provides it; otherwise ``log p`` of the true token where it is
    the argmax (then it *is* the maximum) and the maximum of ``next_token_logprobs`` of the decoded prefix
    elsewhere (exact where the decoded prefix re-encodes to the same tokens; a cut inside a word may not).
    Deviation: Segal et al. threshold the probability of the generated token (or a likelihood ratio
    against a reference, appendix C.2); we use the target model's own probability, no reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from typing import ClassVar

from bench.attack import Attack, Scores
from bench.errors import CapabilityError, MetricError
from bench.lm import GENERATE, NEXT_TOKEN_DISTRIBUTION, TOKEN_LOGPROBS
from bench.metrics import MetricRow, clopper_pearson, validate_scores
from bench.params import Param
from bench.registry import register_attack

__all__ = ["KExtractionAttack", "PIIExtractionAttack", "TTEAttack", "accuracy_coverage_auc", "extraction_metrics",
           "leading_digits_matched", "EXTRACTION_KINDS"]

EXTRACTION_KINDS = ("k_extraction", "pii", "tte")
_NEXT_TOKEN_CHUNK = 256  # prefixes per next_token_logprobs call in the TTE fallback (bounds n × vocab memory)


# -- helpers ---------------------------------------------------------------------------------------
def _splitter(model, attack: str) -> Callable[[str, int], tuple[str, str]]:
    split = getattr(model, "split_at_token", None)
    if split is None:
        raise CapabilityError(f"attack '{attack}' needs the released model's split_at_token(text, n_tokens) to cut "
                              f"targets at token boundaries, and this model ({type(model).__name__}) has none: add "
                              f"split_at_token to the LanguageModel API (HFLanguageModel and RestrictedModel)")
    return split


def _count_tokens(split: Callable[[str, int], tuple[str, str]], text: str, lo: int, hi: int | None) -> int:
    """Number of tokens of ``text``, at least ``lo`` and at most ``hi`` (None = unbounded), found with split only.

    The smallest n with an empty tail; exponential then binary search (a few tokenisations per text).
    """
    if split(text, lo)[1] == "":
        return lo
    if hi is None:
        step = 1
        hi = lo + step
        while split(text, hi)[1] != "":
            lo, step = hi, step * 2
            hi = lo + step
    elif split(text, hi)[1] != "":
        return hi
    while hi - lo > 1:  # invariant: tail(lo) non-empty, tail(hi) empty
        mid = (lo + hi) // 2
        if split(text, mid)[1] == "":
            hi = mid
        else:
            lo = mid
    return hi


#: UTF-8 spreads a character over at most 4 bytes, so a cut moves past at most 3 more tokens
_MAX_CHARACTER_TOKENS = 4


def _character_boundary(split: Callable[[str, int], tuple[str, str]], text: str, k: int) -> int:
    """``k``, or the first token count after it that ends on a character: byte-level BPE spreads a multi-byte
    character over several tokens, and a prefix cut inside one decodes to U+FFFD, which is not a prefix of the
    target and not a prompt the model was trained on."""
    n = k
    head, rest = split(text, n)
    while rest and head.endswith("\ufffd") and not text.startswith(head) and n < k + _MAX_CHARACTER_TOKENS:
        n += 1
        head, rest = split(text, n)
    return n


# -- k-extractable memorization --------------------------------------------------------------------
class ExtractionAttack(Attack):
    """An extraction attack: one value per target (extracted or not, digits recovered, token accuracy) whose rows of
    :func:`extraction_metrics` of its ``extraction_kind`` it reports next to AUC."""

    family = "extraction"
    extraction_kind: ClassVar[str] = ""

    def metrics(self, labels, output, ctx) -> list[MetricRow]:
        return extraction_metrics(labels, output.scores, self.extraction_kind,
                                  id_digits=int((ctx.public_format or {}).get("id_digits", 10)),
                                  details=output.details, alpha=ctx.alpha)


@register_attack("k_extraction")
class KExtractionAttack(ExtractionAttack):
    family = "extraction"
    extraction_kind = "k_extraction"  # which extraction_metrics rows the runner adds
    description = ("k-extractable memorization: greedy decoding from the target's first k tokens reproduces its "
                   "next suffix_tokens tokens exactly (1) or not (0).")
    reference = ("Carlini et al. 2023a; Marek et al. 2026, appendix B.6 (k = 10) and A.3; Ganesh et al. 2025, §5.2, "
                 "Definition 5.1")
    requires = frozenset({GENERATE})
    params = (
        Param("k", int, 10, "tokens of context given to the model (Marek et al. 2026: 10)", low=1),
        Param("suffix_tokens", int, 50, "suffix length in tokens, clipped to the target's remaining tokens; "
              "null = the whole remainder", low=1, nullable=True),
    )

    def _cut(self, split, text: str) -> tuple[str, str, int]:
        """(prefix, true suffix, suffix length in tokens); length 0 when the target has at most k tokens."""
        k = _character_boundary(split, text, self.k)
        head, rest = split(text, k)
        if rest == "":
            return head, "", 0
        m = _count_tokens(split, text, k, None if self.suffix_tokens is None else k + self.suffix_tokens)
        m -= k
        head2, tail2 = split(text, k + m)
        if tail2 == "":
            suffix = rest
        elif head2.startswith(head):
            suffix = head2[len(head):]
        elif rest.endswith(tail2):
            suffix = rest[: len(rest) - len(tail2)]
        else:
            raise ValueError(f"the model's decoding is not concatenative: the first {k} tokens of a target "
                             f"do not decode to a prefix of its first {k + m} tokens; split_at_token must "
                             f"decode without cleaning up spaces")
        return head, suffix, m

    def score(self, view):
        split = _splitter(view.model, self.name)
        cuts = [self._cut(split, t) for t in view.texts]
        out = np.zeros(len(cuts), dtype=np.float64)
        by_len: dict[int, list[int]] = {}
        for i, (_, _, m) in enumerate(cuts):
            if m > 0:
                by_len.setdefault(m, []).append(i)
        for m, idx in sorted(by_len.items()):  # one generate call per suffix length
            gens = view.model.generate([cuts[i][0] for i in idx], m)
            for i, g in zip(idx, gens):
                out[i] = 1.0 if g == cuts[i][1] else 0.0
        return out


# -- PII extraction (Names2IDs) ---------------------------------------------------------------------
def leading_digits_matched(generated: str, true_id: str, separator: str = " ") -> int:
    """How many leading digits of ``true_id`` the continuation ``generated`` reproduces, in order.

    ``separator`` (the template's text between prompt and ID) is dropped when the continuation starts
    with it; the digits must then follow immediately.
    """
    rest = generated[len(separator):] if separator and generated.startswith(separator) else generated
    digits = re.match(r"[0-9]*", rest).group()
    n = 0
    for a, b in zip(digits, true_id):
        if a != b:
            break
        n += 1
    return n


def _pii_parser(fmt: dict) -> tuple[Callable[[str], tuple[str, str]], Callable[[str], str], str]:
    """(parse record -> (name, id), prompt of a name, separator between prompt and ID) from the public format."""
    template, prompt = fmt.get("template"), fmt.get("prompt")
    if not isinstance(template, str) or not isinstance(prompt, str) or "{id}" not in template \
            or "{name}" not in template or "{name}" not in prompt:
        raise CapabilityError(f"pii_extraction needs a public format with a 'template' containing {{name}} and {{id}} "
                              f"and a 'prompt' containing {{name}} (got template={template!r}, prompt={prompt!r})")
    pieces = re.split(r"(\{name\}|\{id\})", template)
    pattern = "".join("(?P<name>.+?)" if p == "{name}" else "(?P<id>[0-9]+)" if p == "{id}" else re.escape(p)
                      for p in pieces)
    rx = re.compile(pattern, re.DOTALL)
    marker = "\x00"
    rendered, prompted = template.format(name="N", id=marker), prompt.format(name="N")
    if not rendered.startswith(prompted) or rendered.index(marker) < len(prompted):
        raise CapabilityError(f"pii_extraction: the prompt {prompt!r} is not the part of the template {template!r} "
                              f"before the ID")
    separator = rendered[len(prompted):rendered.index(marker)]

    def parse(text: str) -> tuple[str, str]:
        m = rx.fullmatch(text)
        if m is None:
            raise ValueError(f"target {text[:80]!r} does not follow the public template {template!r}")
        return m.group("name"), m.group("id")

    return parse, lambda name: prompt.format(name=name), separator


@register_attack("pii_extraction")
class PIIExtractionAttack(ExtractionAttack):
    family = "extraction"
    extraction_kind = "pii"
    description = ("PII extraction (Names2IDs): prompt 'Name: <name>, ID:', decode greedily token by token; score = "
                   "leading ID digits recovered (mean = AEL; all digits = full extraction, FER).")
    reference = "Segal et al. 2025, §5.2 (PII extraction, AEL and FER on Names2IDs)"
    requires = frozenset({GENERATE})
    params = (
        Param("max_new_tokens", int, None, "tokens decoded per prompt; null = id_digits + the separator's length "
              "(a token of a correct continuation holds at least one character)", low=1, nullable=True),
    )

    def check_task(self, public_format, unit: str) -> None:
        """PII tasks only (names2ids): the prompts are built from the targets' public template."""
        if not public_format or public_format.get("kind") != "pii":
            raise CapabilityError(f"pii_extraction needs a PII task (names2ids); this task's public format is "
                                  f"{(public_format or {}).get('kind')!r}: drop pii_extraction from the suite or use "
                                  f"a PII task")
        _pii_parser(public_format)

    def score(self, view):
        fmt = view.public_format
        self.check_task(fmt, view.unit)
        parse, make_prompt, sep = _pii_parser(fmt)
        n_digits = int(fmt.get("id_digits", 10))
        records = [parse(t) for t in view.texts]
        n_new = self.max_new_tokens if self.max_new_tokens is not None else n_digits + len(sep)
        gens = view.model.generate([make_prompt(name) for name, _ in records], n_new) if records else []
        return np.array([min(leading_digits_matched(g, pid, sep), n_digits) for g, (_, pid) in zip(gens, records)],
                        dtype=np.float64)


# -- token-by-token extraction ---------------------------------------------------------------------
def accuracy_coverage_auc(correct, confidence) -> float:
    """Area under the accuracy-coverage curve of selective prediction (TTE of Segal et al. 2025; Geifman &
    El-Yaniv 2017).

    Predictions are accepted in order of decreasing confidence; after accepting the top ``i`` of ``n`` the
    coverage is ``i/n`` and the accuracy the share of them that is correct. The area over coverage (0, 1] is
    the trapezoid rule through the points ``(i/n, acc_i)``, ``i = 1..n``, with the first accuracy held on
    (0, 1/n] — so equal confidences give exactly the overall accuracy (ACC). Tied confidences are accepted
    together: inside a tie block the accuracy is its expectation over the order of the tied predictions,
    so the result never depends on how ties are ordered.
    """
    c = np.asarray(correct, dtype=np.float64).reshape(-1)
    s = np.asarray(confidence, dtype=np.float64).reshape(-1)
    if c.shape != s.shape:
        raise MetricError(f"{c.size} correctness flags but {s.size} confidences: pass one of each per prediction")
    if c.size == 0:
        raise MetricError("no predictions: the accuracy-coverage AUC needs at least one")
    if not np.isfinite(s).all() or not np.isin(c, (0.0, 1.0)).all():
        raise MetricError("correctness must be 0/1 and confidences finite")
    order = np.argsort(-s, kind="stable")
    c, s = c[order], s[order]
    n = c.size
    cum = np.cumsum(c)
    last = np.r_[np.nonzero(np.diff(s))[0], n - 1]          # last index of each tie block
    first = np.r_[0, last[:-1] + 1]
    before = np.r_[0.0, cum[last[:-1]]]                      # correct predictions before each block
    rate = (cum[last] - before) / (last - first + 1)          # accuracy inside each block
    block = np.repeat(np.arange(last.size), last - first + 1)
    i = np.arange(1, n + 1, dtype=np.float64)
    expected_correct = before[block] + (i - first[block]) * rate[block]
    acc = expected_correct / i
    cov = i / n
    return float(acc[0] * cov[0] + (0.5 * (acc[1:] + acc[:-1]) * np.diff(cov)).sum())


@register_attack("tte")
class TTEAttack(ExtractionAttack):
    family = "extraction"
    extraction_kind = "tte"
    description = ("Token-by-token extraction: predict every next token greedily from the true prefix; value = "
                   "accuracy when always accepting (ACC); accuracy-coverage AUC over confidence = max next-token "
                   "probability.")
    reference = "Segal et al. 2025, §5.2 (TTE: accuracy-coverage AUC and ACC); Geifman & El-Yaniv 2017"
    requires = frozenset({TOKEN_LOGPROBS, NEXT_TOKEN_DISTRIBUTION})
    params = ()

    def _fill_confidences(self, view, texts: Sequence[str], sigs, logconf: list[np.ndarray]) -> None:
        """Max next-token log-probability where the true token is not the argmax, from next_token_logprobs."""
        need = [(i, int(j)) for i, s in enumerate(sigs) if getattr(s, "top1_logprob", None) is None
                for j in np.nonzero(np.asarray(s.top1) == 0)[0]]
        if not need:
            return
        split = _splitter(view.model, self.name)
        heads: dict[tuple[int, int], str] = {}
        for i, j in need:
            heads[(i, j)] = split(texts[i], j)[0]
        for start in range(0, len(need), _NEXT_TOKEN_CHUNK):
            chunk = need[start:start + _NEXT_TOKEN_CHUNK]
            rows = np.asarray(view.model.next_token_logprobs([heads[key] for key in chunk]), dtype=np.float64)
            best = rows.max(axis=1)
            for (i, j), b in zip(chunk, best):
                logconf[i][j] = max(float(b), logconf[i][j])  # the max is at least the true token's log p

    def score(self, view):
        texts = view.texts
        sigs = view.model.token_signals(texts) if texts else []
        correct, logconf = [], []
        for s in sigs:
            c = np.asarray(s.top1).astype(np.int8)
            t1 = getattr(s, "top1_logprob", None)
            # where the true token is the argmax its log p is the maximum; elsewhere filled in below
            lp = np.asarray(t1 if t1 is not None else s.logprobs, dtype=np.float64).copy()
            correct.append(c)
            logconf.append(lp)
        self._fill_confidences(view, texts, sigs, logconf)
        # details per target, in view.targets order: per-token correctness and confidence, for the coverage AUC
        return Scores(np.array([float(c.mean()) if c.size else 0.0 for c in correct], dtype=np.float64),
                      {"correct": correct, "confidence": [np.exp(lp) for lp in logconf]})


# -- metrics ---------------------------------------------------------------------------------------
def extraction_metrics(labels, values, kind: str, *, id_digits: int = 10, details: dict | None = None,
                       alpha: float = 0.05) -> list[MetricRow]:
    """Extraction outcomes of members (pos) and non-members (neg, the control).

    * ``k_extraction``: ``extractable_count_{pos,neg}`` and ``extractable_rate_{pos,neg}`` (Clopper-Pearson CI);
    * ``pii``: ``pii_ael_{pos,neg}`` (mean leading digits recovered) and ``pii_fer_{pos,neg}`` (share with all
      ``id_digits`` digits, Clopper-Pearson CI);
    * ``tte``: ``tte_acc_{pos,neg}`` (mean per-target ACC) and, given the attack's ``details`` (per-target token
      correctness and confidence, in target order), ``tte_token_acc_{pos,neg}`` (ACC over the pooled tokens)
      and ``tte_coverage_auc_{pos,neg}`` (accuracy-coverage AUC over the pooled tokens of the class).
    """
    y, v = validate_scores(labels, values)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    classes = (("pos", y == 1), ("neg", y == 0))
    rows: list[MetricRow] = []

    def rate_rows(rate_name: str, hits: np.ndarray, count_name: str | None = None) -> None:
        for name, sel in classes:
            k, n = int(hits[sel].sum()), int(sel.sum())
            lo, hi = clopper_pearson(k, n, alpha)
            if count_name:
                rows.append(MetricRow(f"{count_name}_{name}", float(k), None, None, n_pos, n_neg))
            rows.append(MetricRow(f"{rate_name}_{name}", k / n, lo, hi, n_pos, n_neg))

    if kind == "k_extraction":
        if not np.isin(v, (0.0, 1.0)).all():
            raise MetricError("k_extraction values must be 0 (not extractable) or 1 (extractable)")
        rate_rows("extractable_rate", v == 1.0, "extractable_count")
    elif kind == "pii":
        if (v < 0).any() or (v > id_digits).any():
            raise MetricError(f"pii values must be leading-digit counts in [0, {id_digits}]")
        for name, sel in classes:
            rows.append(MetricRow(f"pii_ael_{name}", float(v[sel].mean()), None, None, n_pos, n_neg))
        rate_rows("pii_fer", v >= id_digits)
    elif kind == "tte":
        for name, sel in classes:
            rows.append(MetricRow(f"tte_acc_{name}", float(v[sel].mean()), None, None, n_pos, n_neg))
        if details is not None:
            corr, conf = details["correct"], details["confidence"]
            if len(corr) != len(y) or len(conf) != len(y):
                raise MetricError(f"tte details cover {len(corr)} targets but there are {len(y)} labels: pass the "
                                  f"details the attack returned for this game")
            for name, sel in classes:
                idx = np.nonzero(sel)[0]
                c = np.concatenate([np.asarray(corr[i], dtype=np.float64).reshape(-1) for i in idx])
                s = np.concatenate([np.asarray(conf[i], dtype=np.float64).reshape(-1) for i in idx])
                if c.size == 0:
                    continue
                rows.append(MetricRow(f"tte_token_acc_{name}", float(c.mean()), None, None, n_pos, n_neg))
                rows.append(MetricRow(f"tte_coverage_auc_{name}", accuracy_coverage_auc(c, s), None, None,
                                      n_pos, n_neg))
    else:
        raise MetricError(f"unknown extraction kind {kind!r}: use one of {', '.join(EXTRACTION_KINDS)}")
    return rows
