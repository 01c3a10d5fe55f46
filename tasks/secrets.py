"""Secrets: made-up words, codenames or API keys, each carried by several real records (Ganesh et al. 2025, Hush).

Ganesh, McMahan, Nasr, Steinke and Thakurta (2025), "Hush! Protecting Secrets During Model Training: An
Indistinguishability Approach", protect *secrets* y_j, each contained in a set of examples D_j (E(x) = the
secrets in x), each with its own protection target (p_j, r_j): for a prior probability p_j of guessing the
secret, the posterior probability of reconstructing it from the model is at most r_j. Their experiment treats
rare words as secrets ("roughly 50 to 100 times each", "a fixed p_j = 10^-10 and ... a uniformly random r_j in
[2·10^-4, 10^-3]"), so *every* training example carries secrets. Here:

* A secret is, by ``secret_kind``: ``word`` — a made-up pronounceable word (their rare words, but guaranteed
  absent from every other text); ``codename`` — a capitalised made-up word and a number (``Velmora-42``);
  ``api_key`` — ``sk-`` and 24 base62 characters; ``mixed`` — the three in turn.
* Secret j is carried by k_j records, k_j uniform in ``[records_per_secret_min, records_per_secret_max]``
  or Zipf(``zipf_a``) shifted to start at the minimum and clipped (their experiment: 50-100; the tiny models
  here get fewer). A carrier is a real mini_pile record with one line inserted at a uniformly drawn line
  boundary: a template natural for the text (a comment or assignment in code, keeping the indentation of
  the next line; a short sentence in prose), drawn per record. Code or prose is judged from the text itself
  (:func:`is_code_text`), so target and non-target records follow one rule.
* Each record carries exactly one secret (Ganesh et al. allow several; one keeps the secrets' record sets
  disjoint so each secret can be one membership unit).
* p_j = ``p`` (Ganesh et al.: 1e-10) for every secret; r_j uniform in [``r_min``, ``r_max``] (their
  [2e-4, 1e-3]).

**Target secrets and background secrets.** ``n_secrets`` *target* secrets are carried by records of
mini_pile's target pool; they are the membership units (``TaskData.targets``). Every record of the adaptation
pool (``adapt``), the attacker's population (``population``) and the held-out utility data (``heldout``)
carries a *background* secret as well, drawn from the same distributions: same kinds (in turn for ``mixed``),
same carriers-per-secret distribution, same templates, same p and r_j distribution. So, from the defense's
point of view, a b=1 target secret and a background secret look alike — every training record carries
exactly one secret, whose number of carriers in D, kind and r_j are distributed alike for both — and a defense
that drops secret-bearing records drops background and targets at one rate. The attacker's data and the
utility data come from the same distribution as the targets. Pretraining data stays secret-free.

Background secrets are assigned in **contiguous blocks** of each partition, in the partition's (hash-random)
order: the challenger takes the first ``adapt_background`` records of ``adapt`` as D's background (and the next
``n_validation`` as validation), and the runner slices the population the same way, so every secret but the
one straddling a cut has all its drawn carriers on one side. The straddling secret has only part of its
carriers in D (possibly fewer than ``records_per_secret_min``), and each partition's last secret keeps the
remainder of its block: a few records that can only be background, which tells a defense nothing about which
records are targets.

* No secret occurs (case-insensitively) in pretraining data, in any record of the base corpus, in a
  template, in a record other than its own carriers, nor inside another secret: secrets consist of
  ``[A-Za-z0-9-]`` and are inserted between characters outside that set, so an occurrence is always inside
  one maximal run of such characters, and the build checks every secret against the runs of every text.

Membership unit ``"secret"``: ``target_meta[id]["secret_id"]`` names the secret of each target carrier; the
challenger puts all carriers of a secret in one (a, b) group and counts world sizes in secrets
(:func:`bench.units.draw_unit_groups`).

Who knows what (Ganesh et al. 2025, section 3: "we do not protect against knowing about the existence of
secrets and which examples contain which secrets, just the contents of examples (i.e., the secrets
themselves)")

* The **defender** is the data owner: it knows every secret in its training data — target and background —
  their (p_j, r_j) and which of its records carry them. The challenger hands a defense this spec for the
  secrets in its training texts with :func:`defender_secrets` (computed from the texts the defense already
  holds and the challenger-only ``TaskData.secret_spec``, so it reveals nothing the defense could not find,
  and no label).
* The **attacker** knows that secrets exist, their number, kinds, formats, the insertion templates, each
  target secret's (p_j, r_j) and carrier count, keyed by an opaque ``secret_id`` —
  ``public_format["secrets"]``, the membership units only — but not the secret strings (those are what is
  protected; they sit in ``target_meta`` and ``secret_spec``, challenger-only). In a membership game the
  carriers are the candidates shown, so their texts (and the secret in them) are visible there, as for any
  membership target: a secret target's ``Target.samples`` are its carriers (:func:`bench.units.unit_samples`),
  under an opaque id. The attacker owns its population, so the secrets in it are its own.
* The game gives a defense ``AdaptationData.secrets`` (the secret ids each training text carries) and
  ``secret_targets`` (their (p_j, r_j)), from :func:`defender_secrets` (:func:`bench.units.secrets_of`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from bench.errors import ConfigError, DataError
from bench.hashing import content_hash
from bench.params import Param
from bench.registry import register_task
# the defender's facts and the secret-run convention live in the game core; re-exported for this module's users
from bench.units import SECRET_RUN, defender_secrets
from tasks.derived import derived_fingerprint, partition_stats
from bench.task import TargetRecord, Task, TaskData
from tasks.mini_pile import MiniPile, OnMiniPile

__all__ = ["SECRET_KINDS", "CODE_TEMPLATES", "PROSE_TEMPLATES", "SECRET_RUN", "BACKGROUND_PARTITIONS",
           "make_secret", "find_secret", "text_runs", "insert_line", "is_code_text", "defender_secrets", "Secrets",
           "SecretsReplaced"]

SECRET_KINDS = ("word", "codename", "api_key")
#: a line that looks like Python: a statement keyword, a comment, a call, a comparison, an assignment, brackets
CODE_LINE = re.compile(r"""^\s*(def |class |import |from \S+ import|return\b|if .*:$|elif |else:|for .*:$|while .*:$"""
                       r"""|try:|except\b|finally:|with .*:$|raise\b|yield\b|@\w|#|\"\"\"|''')|[=!<>]=|\w\("""
                       r"""|\)\s*:?$|^\s*\w+(\.\w+)*\s*=[^=]|[\[\]{}]""")
#: the partitions whose every record carries a background secret (pretraining stays secret-free)
BACKGROUND_PARTITIONS = ("adapt", "population", "heldout")

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

#: the public formats above as patterns (a secret is a whole run of [A-Za-z0-9-]; see make_secret)
SECRET_PATTERNS = {
    "word": r"[a-z]{7,14}",
    "codename": r"[A-Z][a-z]{4,11}-[0-9]{1,2}",
    "api_key": r"sk-[A-Za-z0-9]{24}",
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


def is_code_text(text: str) -> bool:
    """Whether ``text`` reads as code: two or more non-blank lines, at least half of them code-like (:data:`CODE_LINE`).

    Judged from the text, not from the record's source, because adaptation, population and held-out records
    carry no source: one rule for target and background carriers keeps their templates alike. On the default
    mini_pile (3,000,000 characters per source) it agrees with the source label on 1,435 of the 1,507 target
    records; the rest are mostly stdlib docstrings and comment blocks, which it reads as prose.
    """
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return len(lines) >= 2 and 2 * sum(bool(CODE_LINE.search(ln)) for ln in lines) >= len(lines)


def insert_line(text: str, line: str, rng: np.random.Generator, *, code: bool) -> str:
    """``line`` inserted at a uniformly drawn line boundary of ``text`` (code: indented like the next line)."""
    lines = text.split("\n")
    pos = int(rng.integers(0, len(lines) + 1))
    indent = ""
    if code:
        ref = lines[pos] if pos < len(lines) else lines[-1]
        indent = ref[: len(ref) - len(ref.lstrip(" \t"))]
    return "\n".join(lines[:pos] + [indent + line] + lines[pos:])


def find_secret(public_format: dict[str, Any], text: str) -> tuple[int, int] | None:
    """(start, end) of the secret in a carrier, found from the public format alone: a line that is one of the
    templates with a run of the secret's format in its placeholder (the first such line), or None.

    What the attacker knows (module docstring): the templates and the secret formats, never the strings. A
    background or population record is found the same way, so the split marks nothing about membership."""
    kinds = [k for k in SECRET_KINDS if k in public_format.get("secret_formats", {})]
    templates = public_format.get("templates", {})
    patterns = []
    for kind in kinds:
        for t in templates.get("code", {}).get(kind, []) + templates.get("prose", {}).get(kind, []):
            head, _, tail = t.partition("{secret}")
            patterns.append(re.escape(head) + f"(?<![A-Za-z0-9_-])({SECRET_PATTERNS[kind]})(?![A-Za-z0-9_-])"
                            + re.escape(tail))
    if not patterns:
        return None
    line_start = 0
    for line in text.split("\n"):
        for pat in patterns:
            m = re.search(pat + r"\s*$", line)
            if m:
                return line_start + m.start(1), line_start + m.end(1)
        line_start += len(line) + 1
    return None


class _SecretDrawer:
    """Draws distinct secrets absent from every text, none inside another (every occurrence is a whole run)."""

    def __init__(self, forbidden: str, rng: np.random.Generator) -> None:
        self._forbidden = forbidden  # "\n"-joined casefolded runs of every text and template
        self._rng = rng
        self._seen: set[str] = set()
        self._inside: set[str] = set()  # every substring of a secret drawn so far

    def draw(self, kind: str) -> str:
        for _ in range(10_000):
            s = make_secret(kind, self._rng)
            cf = s.casefold()
            subs = {cf[i:j] for i in range(len(cf)) for j in range(i + 1, len(cf) + 1)}
            # not inside a drawn secret, no drawn secret inside it, absent from every text
            if cf not in self._inside and not subs & self._seen and cf not in self._forbidden:
                self._seen.add(cf)
                self._inside |= subs
                return s
        raise DataError(f"task 'secrets': could not draw a new {kind} secret after 10000 tries: lower n_secrets "
                        f"or max_chars_per_source")  # pragma: no cover - the made-up spaces are huge


@register_task("secrets")
class Secrets(OnMiniPile, Task):
    description = ("Secrets (Ganesh et al. 2025, Hush): made-up words, codenames or API keys, each inserted into "
                   "several mini_pile records, with a per-secret protection target (p_j, r_j); every adaptation, "
                   "population and held-out record carries a background secret too; unit = secret.")
    #: 0.2.0: background secrets in every adaptation, population and held-out record; code/prose by text
    version = "0.2.0"
    params = (
        Param("n_secrets", int, 200, "target secrets (the membership units)", low=1),
        Param("secret_kind", str, "word", "word, codename, api_key, or mixed (the three in turn)",
              choices=SECRET_KINDS + ("mixed",)),
        Param("records_per_secret_min", int, 2, "fewest records carrying one secret", low=1),
        Param("records_per_secret_max", int, 8, "most records carrying one secret", low=1),
        Param("records_per_secret_dist", str, "uniform", "records per secret: uniform in [min, max], or "
              "min - 1 + Zipf(zipf_a) clipped to max", choices=("uniform", "zipf")),
        Param("zipf_a", float, 2.0, "Zipf exponent of records per secret", low=1.0, low_inclusive=False),
        Param("p", float, 1e-10, "prior reconstruction probability p_j of every secret (Ganesh et al. 2025: 1e-10)",
              low=0.0, high=1.0, low_inclusive=False, high_inclusive=False),
        Param("r_min", float, 2e-4, "r_j is uniform in [r_min, r_max] (Ganesh et al. 2025: [2e-4, 1e-3])", low=0.0,
              high=1.0, low_inclusive=False),
        Param("r_max", float, 1e-3, "r_j is uniform in [r_min, r_max]", low=0.0, high=1.0, low_inclusive=False),
        Param("seed", int, 0, "seed of secrets, carriers, counts, templates and r_j"),
    ) + MiniPile.params

    #: what a b = 0 target secret leaves in D: nothing (False: a presence test) or its carriers with the secret
    #: replaced by a fresh draw (True, task ``secrets_replaced``: Hush's neighbouring dataset)
    replace_negatives: ClassVar[bool] = False

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

    def _draw_counts(self, rng: np.random.Generator, size: int) -> list[int]:
        """``size`` carrier counts from the records-per-secret distribution (one for targets and background)."""
        lo, hi = self.records_per_secret_min, self.records_per_secret_max
        if self.records_per_secret_dist == "uniform":
            raw = rng.integers(lo, hi + 1, size=size)
        else:
            raw = (lo - 1) + rng.zipf(self.zipf_a, size=size)
        return np.clip(raw, lo, hi).astype(np.int64).tolist()

    def _counts(self) -> list[int]:
        """Carrier counts of the ``n_secrets`` target secrets."""
        return self._draw_counts(_rng("counts", self.seed), self.n_secrets)

    def _blocks(self, n: int, partition: str) -> list[int]:
        """Carrier counts of the background secrets covering all ``n`` records of ``partition``, in order.

        Counts are drawn as for target secrets until they cover the partition; the last secret keeps the
        remainder (see the module docstring on contiguous blocks).
        """
        counts = self._draw_counts(_rng("counts", self.seed, partition), n)  # each count >= 1: enough to cover n
        out: list[int] = []
        total = 0
        for k in counts:
            out.append(min(k, n - total))
            total += out[-1]
            if total == n:
                return out
        raise AssertionError("unreachable: n counts of at least 1 cover n records")  # pragma: no cover

    def _kinds(self, n: int) -> list[str]:
        return [SECRET_KINDS[j % 3] if self.secret_kind == "mixed" else self.secret_kind for j in range(n)]

    @staticmethod
    def _carry(text: str, secret: str, kind: str, rng: np.random.Generator) -> tuple[str, str]:
        """``text`` with one line holding ``secret`` inserted, and the template used (code or prose by the text)."""
        code = is_code_text(text)
        template = _pick(rng, (CODE_TEMPLATES if code else PROSE_TEMPLATES)[kind])
        return insert_line(text, template.format(secret=secret), rng, code=code), template

    @staticmethod
    def _neighbours(targets: Sequence[TargetRecord], meta: dict[str, dict[str, Any]],
                    spec: dict[str, dict[str, Any]], drawer: _SecretDrawer) -> list[tuple[str, str, str]]:
        """Hush's neighbour of every target carrier: the same text with its secret replaced by a fresh draw.

        Ganesh et al. 2025 (Definition 3.1) call two inputs adjacent in secret j when they differ only in the
        secret's content inside the records carrying it, with the structure (which records carry which secret,
        and its (p_j, r_j)) shared. So the replacement s'_j gets the target's ``secret_id``, p, r and carrier
        count, and a record id's ``target_meta`` keeps its neighbour text under ``"neighbour"``; the challenger
        trains on the neighbours of b = 0 secrets (:meth:`bench.game.Challenger.adaptation_data`).
        """
        fresh: dict[str, str] = {}
        out: list[tuple[str, str, str]] = []
        for t in targets:
            m = meta[t.id]
            if m["secret"] not in fresh:
                s2 = drawer.draw(m["secret_kind"])
                fresh[m["secret"]] = s2
                spec[s2] = {**spec[m["secret"]], "replaces": m["secret_id"]}
            s2 = fresh[m["secret"]]
            # the carrier holds its secret exactly once (checked below), inside one run of secret characters
            text = t.text.replace(m["secret"], s2)
            m["neighbour"] = text
            m["neighbour_secret"] = s2
            out.append((f"neighbour of {t.id}", text, s2))
        return out

    def build(self, cache=None) -> TaskData:
        base = MiniPile(**{p.name: self.config[p.name] for p in MiniPile.params}).build(cache)
        counts = self._counts()
        carriers_pool = list(base.targets)
        if sum(counts) > len(carriers_pool):
            raise DataError(f"task 'secrets': {self.n_secrets} secrets need {sum(counts)} carrier records but "
                            f"mini_pile has {len(carriers_pool)} target records: lower n_secrets or "
                            f"records_per_secret_max, or raise max_chars_per_source")
        templates = [t for table in (CODE_TEMPLATES, PROSE_TEMPLATES) for ts in table.values() for t in ts]
        forbidden = "\n".join(sorted(text_runs(list(base.pretrain) + list(base.heldout) + list(base.population)
                                                + list(base.adapt) + [r.text for r in base.targets] + templates)))
        drawer = _SecretDrawer(forbidden, _rng("secrets", self.seed, self.secret_kind))
        spec: dict[str, dict[str, Any]] = {}

        # target secrets: drawn first, carried by records of mini_pile's target pool
        kinds = self._kinds(self.n_secrets)
        secrets = [drawer.draw(kind) for kind in kinds]
        r_values = _rng("r", self.seed).uniform(self.r_min, self.r_max, size=self.n_secrets).tolist()
        order = _rng("carriers", self.seed).permutation(len(carriers_pool)).tolist()
        targets: list[TargetRecord] = []
        meta: dict[str, dict[str, Any]] = {}
        public: dict[str, dict[str, Any]] = {}
        own: list[tuple[str, str, str]] = []  # (where, text, its secret) of every carrier, for the final check
        start = 0
        for j, (s, kind, k, r) in enumerate(zip(secrets, kinds, counts, r_values)):
            sid = "s-" + content_hash("privbench-secrets", "id", self.seed, j, s, length=12)
            public[sid] = {"p": self.p, "r": r, "n_records": k, "secret_kind": kind}
            spec[s] = {"secret_id": sid, "p": self.p, "r": r, "n_records": k, "kind": kind, "partition": "targets"}
            for idx in order[start:start + k]:
                carrier = carriers_pool[idx]
                text, template = self._carry(carrier.text, s, kind, _rng("insert", self.seed, sid, carrier.id))
                rid = f"secret-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"
                targets.append(TargetRecord(rid, text))
                meta[rid] = {"secret": s, "secret_id": sid, "p": self.p, "r": r, "secret_kind": kind,
                             "carrier_id": carrier.id, "template": template, "n_records": k}
                own.append((rid, text, s))
            start += k

        # background secrets: every record of adapt, population and heldout, in contiguous blocks
        carried: dict[str, tuple[str, ...]] = {}
        background: dict[str, dict[str, Any]] = {}
        for part in BACKGROUND_PARTITIONS:
            texts = getattr(base, part)
            blocks = self._blocks(len(texts), part)
            bkinds = self._kinds(len(blocks))
            br = _rng("r", self.seed, part).uniform(self.r_min, self.r_max, size=len(blocks)).tolist()
            out: list[str] = []
            for j, (k, kind, r) in enumerate(zip(blocks, bkinds, br)):
                s = drawer.draw(kind)
                sid = "s-" + content_hash("privbench-secrets", "id", self.seed, part, j, s, length=12)
                spec[s] = {"secret_id": sid, "p": self.p, "r": r, "n_records": k, "kind": kind, "partition": part}
                for i in range(len(out), len(out) + k):
                    text, _ = self._carry(texts[i], s, kind, _rng("insert", self.seed, sid, part, i))
                    out.append(text)
                    own.append((f"{part}[{i}]", text, s))
            carried[part] = tuple(out)
            c = np.asarray(blocks)
            background[part] = {"n_secrets": len(blocks), "carriers": int(c.sum()),
                                "records_per_secret": {"min": int(c.min()), "max": int(c.max()),
                                                       "mean": float(c.mean())}}

        if self.replace_negatives:
            # drawn after every other secret, so the default world (absent) keeps its draws
            own += self._neighbours(targets, meta, spec, drawer)

        # every carrier holds exactly its own secret, once; no other text holds any
        by_cf = {s.casefold(): s for s in spec}
        for where, text, s in own:
            runs = SECRET_RUN.findall(text.casefold())
            found = [by_cf[x] for x in runs if x in by_cf]
            if found != [s]:  # pragma: no cover - guaranteed by construction
                raise DataError(f"task 'secrets': record {where} carries {sorted(found)}, not once its own secret")
        if any(x in by_cf for x in text_runs(base.pretrain)):  # pragma: no cover - guaranteed by the draw
            raise DataError("task 'secrets': a secret occurs in the pretraining data")

        public_format = {
            "kind": "secrets", "unit": "secret", "secrets": public,
            **({"negatives": "replaced"} if self.replace_negatives else {}),
            "secret_formats": {k: SECRET_FORMATS[k] for k in sorted(set(kinds))},
            "templates": {"code": {k: list(CODE_TEMPLATES[k]) for k in sorted(set(kinds))},
                          "prose": {k: list(PROSE_TEMPLATES[k]) for k in sorted(set(kinds))}},
        }
        fingerprint = derived_fingerprint({"name": self.name, "version": self.version, "config": self.config,
                                           "base": base.fingerprint, "public_format": public_format, "meta": meta,
                                           "secret_spec": spec, "heldout": content_hash(list(carried["heldout"]))},
                                          targets, carried["adapt"], carried["population"])
        synthetic = {"name": "secrets", "kind": "secrets", "version": self.version,
                     "description": f"{self.n_secrets} synthetic {self.secret_kind} target secrets inserted into "
                                    f"mini_pile target records, and background secrets of the same distribution "
                                    f"in every adaptation, population and held-out record, seed {self.seed}",
                     "provenance": "generated by privbench", "license": "synthetic; carriers under the mini_pile "
                                                                        "sources' licenses"}
        stats = partition_stats(pretrain=base.pretrain, heldout=carried["heldout"], population=carried["population"],
                                adapt=carried["adapt"], targets=[t.text for t in targets])
        c = np.asarray(counts)
        stats["secrets"] = {"n_secrets": self.n_secrets, "secret_kind": self.secret_kind,
                            "records_per_secret": {"min": int(c.min()), "max": int(c.max()), "mean": float(c.mean())},
                            "carriers": int(c.sum()), "p": self.p, "r_min": min(r_values), "r_max": max(r_values),
                            "background": background}
        return TaskData(
            name=self.name, pretrain=base.pretrain, heldout=carried["heldout"], population=carried["population"],
            adapt=carried["adapt"], targets=tuple(targets), fingerprint=fingerprint,
            sources=tuple(base.sources) + (synthetic,), stats=stats, relation=base.relation, unit="secret",
            target_meta=meta, public_format=public_format, secret_spec=spec,
        )


@register_task("secrets_replaced")
class SecretsReplaced(Secrets):
    description = ("Secrets whose b = 0 units are trained on with the secret replaced by a fresh draw of the same "
                   "kind (Ganesh et al. 2025, Definition 3.1: the neighbouring dataset Hush's guarantee bounds); "
                   "otherwise the secrets task. The game then tests the secret's content, not its carriers' presence.")
    version = "0.1.0"
    replace_negatives = True
