"""Secrets: made-up words, codenames or API keys, each carried by several real records (source 001, Hush).

Source 001 protects *secrets* y_j, each contained in a set of examples D_j (E(x) = the secrets in x),
each with its own protection target (p_j, r_j): for a prior probability p_j of guessing the secret,
the posterior probability of reconstructing it from the model is at most r_j. 001's experiment
treats rare words as secrets ("roughly 50 to 100 times each", "a fixed p_j = 10^-10 and ... a
uniformly random r_j in [2·10^-4, 10^-3]"). Here:

* A secret is, by ``secret_kind``: ``word`` — a made-up pronounceable word (001's rare words, but
  guaranteed absent from every other text); ``codename`` — a capitalised made-up word and a number
  (``Velmora-42``); ``api_key`` — ``sk-`` and 24 base62 characters; ``mixed`` — the three in turn.
* Secret j is carried by k_j records, k_j uniform in ``[records_per_secret_min, records_per_secret_max]``
  or Zipf(``zipf_a``) shifted to start at the minimum and clipped (001's experiment: 50-100; the
  tiny models here get fewer). A carrier is a real mini_pile target record with one line inserted at
  a uniformly drawn line boundary: a template natural for the text (a comment or assignment in code,
  keeping the indentation of the next line; a short sentence in prose), drawn per record.
* Each record carries exactly one secret (001 allows several; one keeps the secrets' record sets
  disjoint so each secret can be one membership unit).
* p_j = ``p`` (001: 1e-10) for every secret; r_j uniform in [``r_min``, ``r_max``] (001: [2e-4, 1e-3]).
* No secret occurs (case-insensitively) in pretrain, heldout, population or adaptation data, nor in
  any mini_pile target record, nor inside another secret: secrets consist of ``[A-Za-z0-9-]`` and are
  inserted between characters outside that set, so an occurrence is always inside one maximal run of
  such characters, and the build checks every secret against the runs of every text.

Membership unit ``"secret"``: ``target_meta[id]["secret_id"]`` names the secret of each carrier; the
challenger puts all carriers of a secret in one (a, b) group and counts world sizes in secrets
(:func:`tasks.users.group_targets_by_unit`).

Who knows what (001, section 3: "we do not protect against knowing about the existence of secrets and
which examples contain which secrets, just the contents of examples (i.e., the secrets themselves)")

* The **defender** is the data owner: it knows its secrets, their (p_j, r_j) and which of its
  records carry them. The challenger hands a defense this spec for the secrets in its training texts
  with :func:`defender_secrets` (computed from the texts the defense already holds, so it reveals
  nothing the defense could not find, and no label).
* The **attacker** knows that secrets exist, their number, kinds, formats, the insertion templates,
  each secret's (p_j, r_j) and carrier count, keyed by an opaque ``secret_id`` —
  ``public_format["secrets"]`` — but not the secret strings (those are what is protected; they sit
  in ``target_meta``, challenger-only). In a membership game the carriers are the candidates shown,
  so their texts (and the secret in them) are visible there, as for any membership target: a secret
  target's ``Target.samples`` are its carriers (:func:`bench.units.unit_samples`), under an opaque id.
* The game gives a defense ``AdaptationData.secrets`` (the secret ids each training text carries) and
  ``secret_targets`` (their (p_j, r_j)), from :func:`defender_secrets` (:func:`bench.units.secrets_of`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bench.errors import ConfigError, DataError
from bench.hashing import content_hash
from bench.params import Param
from bench.registry import register_task
from tasks.derived import derived_fingerprint, partition_stats
from bench.task import TargetRecord, Task, TaskData
from tasks.mini_pile import MiniPile

__all__ = ["SECRET_KINDS", "CODE_TEMPLATES", "PROSE_TEMPLATES", "SECRET_RUN", "make_secret", "text_runs",
           "insert_line", "is_code_record", "defender_secrets", "Secrets"]

SECRET_KINDS = ("word", "codename", "api_key")
#: a maximal run of the characters secrets are made of; every occurrence of a secret lies inside one run
SECRET_RUN = re.compile(r"[A-Za-z0-9_\-]+")
CODE_SOURCES = frozenset({"stdlib_code"})

CODE_TEMPLATES = {
    "word": ("# see {secret} for details", 'TOPIC = "{secret}"', "# {secret}: internal only"),
    "codename": ("# project {secret}", 'CODENAME = "{secret}"', "# TODO({secret}): do not ship"),
    "api_key": ('API_KEY = "{secret}"', 'token = "{secret}"  # do not commit',
                'headers["Authorization"] = "Bearer {secret}"'),
}
PROSE_TEMPLATES = {
    "word": ("And they spoke of {secret} again.", "The word was {secret}.", "Remember {secret}, my lord."),
    "codename": ("This is the {secret} matter.", "They named it {secret}.", "Speak not of {secret}."),
    "api_key": ("The key is {secret}.", "Use the passkey {secret} at the gate.", "Write down {secret} and burn it."),
}
SECRET_FORMATS = {
    "word": "made-up lowercase word of 3-4 syllables, 7-14 letters",
    "codename": "capitalised made-up word of 2-3 syllables, '-', a number 2-99",
    "api_key": "'sk-' and 24 characters of [A-Za-z0-9]",
}

_ONSETS = ("b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr",
           "pl", "st", "tr", "th", "sh", "vr", "zh")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "ia")
_CODAS = ("", "", "", "n", "r", "s", "l", "x", "th", "m")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _rng(*parts: Any) -> np.random.Generator:
    return np.random.default_rng(int(content_hash("privbench-secrets", *parts, length=16), 16))


def _pick(rng: np.random.Generator, seq: Sequence[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


def _made_up_word(rng: np.random.Generator, n_syllables: int) -> str:
    return "".join(_pick(rng, _ONSETS) + _pick(rng, _VOWELS) + _pick(rng, _CODAS) for _ in range(n_syllables))


def make_secret(kind: str, rng: np.random.Generator) -> str:
    """One secret of ``kind`` (see :data:`SECRET_FORMATS`); it consists of ``[A-Za-z0-9-]`` only."""
    if kind == "word":
        while True:
            w = _made_up_word(rng, int(rng.integers(3, 5)))
            if 7 <= len(w) <= 14:
                return w
    if kind == "codename":
        while True:
            w = _made_up_word(rng, int(rng.integers(2, 4)))
            if 5 <= len(w) <= 12:
                return f"{w.capitalize()}-{int(rng.integers(2, 100))}"
    if kind == "api_key":
        return "sk-" + "".join(_BASE62[i] for i in rng.integers(0, len(_BASE62), size=24).tolist())
    raise ConfigError(f"unknown secret kind {kind!r}: use one of {', '.join(SECRET_KINDS)}")


def text_runs(texts: Iterable[str]) -> set[str]:
    """Distinct casefolded maximal runs of ``[A-Za-z0-9_-]`` in ``texts``."""
    out: set[str] = set()
    for t in texts:
        out.update(SECRET_RUN.findall(t.casefold()))
    return out


def is_code_record(record_id: str) -> bool:
    """mini_pile record ids are ``<source>-<sha1[:12]>``: code when the source is a code source."""
    return record_id.rsplit("-", 1)[0] in CODE_SOURCES


def insert_line(text: str, line: str, rng: np.random.Generator, *, code: bool) -> str:
    """``line`` inserted at a uniformly drawn line boundary of ``text`` (code: indented like the next line)."""
    lines = text.split("\n")
    pos = int(rng.integers(0, len(lines) + 1))
    indent = ""
    if code:
        ref = lines[pos] if pos < len(lines) else lines[-1]
        indent = ref[: len(ref) - len(ref.lstrip(" \t"))]
    return "\n".join(lines[:pos] + [indent + line] + lines[pos:])


def defender_secrets(data: TaskData, texts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The defender's spec for its training ``texts``: ``{secret: {"secret_id", "p", "r", "n_records"}}``.

    Only secrets that occur in ``texts`` (the data owner knows its own secrets, 001); ``n_records`` counts
    the texts carrying the secret. Computed from ``target_meta`` and the texts only, never from labels.
    """
    spec: dict[str, dict[str, Any]] = {}
    for meta in data.target_meta.values():
        if "secret" in meta:
            spec.setdefault(meta["secret"], {"secret_id": meta["secret_id"], "p": meta["p"], "r": meta["r"],
                                             "n_records": 0})
    by_run = {s.casefold(): s for s in spec}
    for t in texts:
        for s_cf in {r for r in SECRET_RUN.findall(t.casefold()) if r in by_run}:
            spec[by_run[s_cf]]["n_records"] += 1
    return {s: v for s, v in spec.items() if v["n_records"] > 0}


@register_task("secrets")
class Secrets(Task):
    description = ("Secrets (source 001, Hush): made-up words, codenames or API keys, each inserted into several "
                   "mini_pile records, with a per-secret protection target (p_j, r_j); unit = secret.")
    version = "0.1.0"
    params = (
        Param("n_secrets", int, 200, "secrets in the target pool", low=1),
        Param("secret_kind", str, "word", "word, codename, api_key, or mixed (the three in turn)",
              choices=SECRET_KINDS + ("mixed",)),
        Param("records_per_secret_min", int, 2, "fewest records carrying one secret", low=1),
        Param("records_per_secret_max", int, 8, "most records carrying one secret", low=1),
        Param("records_per_secret_dist", str, "uniform", "records per secret: uniform in [min, max], or "
              "min - 1 + Zipf(zipf_a) clipped to max", choices=("uniform", "zipf")),
        Param("zipf_a", float, 2.0, "Zipf exponent of records per secret", low=1.0, low_inclusive=False),
        Param("p", float, 1e-10, "prior reconstruction probability p_j of every secret (001: 1e-10)",
              low=0.0, high=1.0, low_inclusive=False, high_inclusive=False),
        Param("r_min", float, 2e-4, "r_j is uniform in [r_min, r_max] (001: [2e-4, 1e-3])", low=0.0, high=1.0,
              low_inclusive=False),
        Param("r_max", float, 1e-3, "r_j is uniform in [r_min, r_max]", low=0.0, high=1.0, low_inclusive=False),
        Param("seed", int, 0, "seed of secrets, carriers, counts, templates and r_j"),
    ) + MiniPile.params

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.records_per_secret_max < self.records_per_secret_min:
            raise ConfigError(f"task 'secrets': records_per_secret_max ({self.records_per_secret_max}) < "
                              f"records_per_secret_min ({self.records_per_secret_min}): raise the max")
        if self.r_max < self.r_min:
            raise ConfigError(f"task 'secrets': r_max ({self.r_max}) < r_min ({self.r_min}): swap them")
        if not self.p < self.r_min:
            raise ConfigError(f"task 'secrets': p ({self.p}) must be below r_min ({self.r_min}): a posterior "
                              f"bound r_j at or below the prior p_j cannot be met")

    def _counts(self) -> list[int]:
        rng = _rng("counts", self.seed)
        lo, hi = self.records_per_secret_min, self.records_per_secret_max
        if self.records_per_secret_dist == "uniform":
            raw = rng.integers(lo, hi + 1, size=self.n_secrets)
        else:
            raw = (lo - 1) + rng.zipf(self.zipf_a, size=self.n_secrets)
        return np.clip(raw, lo, hi).astype(np.int64).tolist()

    def build(self, cache=None) -> TaskData:
        base = MiniPile(**{p.name: self.config[p.name] for p in MiniPile.params}).build(cache)
        counts = self._counts()
        carriers_pool = list(base.targets)
        if sum(counts) > len(carriers_pool):
            raise DataError(f"task 'secrets': {self.n_secrets} secrets need {sum(counts)} carrier records but "
                            f"mini_pile has {len(carriers_pool)} target records: lower n_secrets or "
                            f"records_per_secret_max, or raise max_chars_per_source")
        forbidden = "\n".join(sorted(text_runs(list(base.pretrain) + list(base.heldout) + list(base.population)
                                                + list(base.adapt) + [r.text for r in base.targets])))
        kinds = [SECRET_KINDS[j % 3] if self.secret_kind == "mixed" else self.secret_kind
                 for j in range(self.n_secrets)]
        srng = _rng("secrets", self.seed, self.secret_kind)
        secrets: list[str] = []
        seen: set[str] = set()
        for kind in kinds:
            for _ in range(10_000):
                s = make_secret(kind, srng)
                cf = s.casefold()
                # absent from every text; no secret inside another (runs hold whole secrets)
                if cf not in seen and not any(cf in o or o in cf for o in seen) and cf not in forbidden:
                    break
            else:  # pragma: no cover - the made-up spaces are huge
                raise DataError(f"task 'secrets': could not draw {self.n_secrets} distinct {kind} secrets")
            seen.add(cf)
            secrets.append(s)
        r_values = _rng("r", self.seed).uniform(self.r_min, self.r_max, size=self.n_secrets).tolist()

        order = _rng("carriers", self.seed).permutation(len(carriers_pool)).tolist()
        targets: list[TargetRecord] = []
        meta: dict[str, dict[str, Any]] = {}
        public: dict[str, dict[str, Any]] = {}
        start = 0
        for j, (s, kind, k, r) in enumerate(zip(secrets, kinds, counts, r_values)):
            sid = "s-" + content_hash("privbench-secrets", "id", self.seed, j, s, length=12)
            public[sid] = {"p": self.p, "r": r, "n_records": k, "secret_kind": kind}
            for idx in order[start:start + k]:
                carrier = carriers_pool[idx]
                code = is_code_record(carrier.id)
                trng = _rng("insert", self.seed, sid, carrier.id)
                template = _pick(trng, (CODE_TEMPLATES if code else PROSE_TEMPLATES)[kind])
                text = insert_line(carrier.text, template.format(secret=s), trng, code=code)
                rid = f"secret-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"
                targets.append(TargetRecord(rid, text))
                meta[rid] = {"secret": s, "secret_id": sid, "p": self.p, "r": r, "secret_kind": kind,
                             "carrier_id": carrier.id, "template": template, "n_records": k}
            start += k
        # every carrier holds exactly its own secret
        by_cf = {s.casefold(): s for s in secrets}
        for t in targets:
            found = {by_cf[x] for x in SECRET_RUN.findall(t.text.casefold()) if x in by_cf}
            if found != {meta[t.id]["secret"]}:  # pragma: no cover - guaranteed by construction
                raise DataError(f"task 'secrets': record {t.id} carries {sorted(found)}, not its own secret")

        public_format = {
            "kind": "secrets", "unit": "secret", "secrets": public,
            "secret_formats": {k: SECRET_FORMATS[k] for k in sorted(set(kinds))},
            "templates": {"code": {k: list(CODE_TEMPLATES[k]) for k in sorted(set(kinds))},
                          "prose": {k: list(PROSE_TEMPLATES[k]) for k in sorted(set(kinds))}},
        }
        fingerprint = derived_fingerprint({"name": self.name, "config": self.config, "base": base.fingerprint,
                                           "public_format": public_format, "meta": meta},
                                          targets, base.adapt, base.population)
        synthetic = {"name": "secrets", "kind": "secrets", "version": self.version,
                     "description": f"{self.n_secrets} synthetic {self.secret_kind} secrets inserted into "
                                    f"mini_pile target records, seed {self.seed}",
                     "provenance": "generated by privbench", "license": "synthetic; carriers under the mini_pile "
                                                                        "sources' licenses"}
        stats = partition_stats(pretrain=base.pretrain, heldout=base.heldout, population=base.population,
                                adapt=base.adapt, targets=[t.text for t in targets])
        c = np.asarray(counts)
        stats["secrets"] = {"n_secrets": self.n_secrets, "secret_kind": self.secret_kind,
                            "records_per_secret": {"min": int(c.min()), "max": int(c.max()), "mean": float(c.mean())},
                            "carriers": int(c.sum()), "p": self.p, "r_min": min(r_values), "r_max": max(r_values)}
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=base.heldout, population=base.population,
            adapt=base.adapt, targets=tuple(targets), fingerprint=fingerprint,
            sources=tuple(base.sources) + (synthetic,), stats=stats, relation=base.relation, unit="secret",
            target_meta=meta, public_format=public_format,
        )

