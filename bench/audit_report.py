"""Per-release audit table for ``privbench audit``: claimed ε against audited ε lower bounds, with the verdict.

Why a separate table: a release's verdict is the worst over its attacks, which the per-evaluation rows do not show,
and the best of A attacks' bounds holds only at confidence 1 − A (1 − c) (union bound), which the table states.
"""

from __future__ import annotations

import math
import re

__all__ = ["audit_rows"]

#: the games with an audit pool (bench/game.py): canaries in D (θ′ audited) and in S (θ audited)
AUDIT_GAMES = ("audit", "audit/pretrain")

_LEVEL = re.compile(r"@([0-9.]+)%")


def _level(metric: str) -> float:
    m = _LEVEL.search(metric)
    return float(m.group(1)) / 100.0 if m else math.nan


def audit_rows(metric_rows: list[dict]) -> list[dict]:
    """One row per (task, model, defense, seed, audit game) of the audit games: claimed ε and δ, the largest ROC and one-run ε
    lower bounds over the attacks, the confidence that maximum holds at, and the verdict (``claim_violated`` if any
    attack's one-run bound at the claimed δ exceeds the claim, ``claim_ok`` if none, ``no claim`` without a finite
    (ε, δ) guarantee). A game whose negatives are neighbours (``secrets_replaced``) adds the secret-level check of a
    KL guarantee (Hush): the claimed μ and the KL lower bound over the attacks, in the same verdict."""
    # the audit games, and any game carrying a secret-level claim check (negatives are neighbours: secrets_replaced)
    secret_games = {(r["task"], r["model"], r["defense"], r["seed"], r["game"]) for r in metric_rows
                    if r["metric"].startswith(("secret_claim@", "kl_lb@"))}
    groups: dict[tuple, list[dict]] = {}
    for r in metric_rows:
        key = (r["task"], r["model"], r["defense"], r["seed"], r["game"])
        if r.get("game") in AUDIT_GAMES or key in secret_games:
            groups.setdefault(key, []).append(r)
    out = []
    for (task, model, defense, seed, game), rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        attacks = sorted({r["attack"] for r in rows})
        roc = [r for r in rows if r["metric"].startswith("eps_lb_roc@")]
        one = [r for r in rows if r["metric"].startswith("eps_lb_one_run@")]
        claims = [r for r in rows if r["metric"].startswith("dp_claim@")]
        kl_claims = [r for r in rows if r["metric"].startswith("secret_claim@")]
        kl = [r for r in rows if r["metric"].startswith("kl_lb@")]
        c = _level((one or roc or claims or kl_claims or kl)[0]["metric"]) if rows else math.nan
        verdict = "no claim"
        if claims or kl_claims:
            verdict = "claim_violated" if any(r["flag"] == "claim_violated" for r in claims + kl_claims) \
                else "claim_ok"
        out.append({
            "task": task, "model": model, "defense": defense, "seed": seed, "game": game,
            "claimed_eps": max((r["value"] for r in claims), default=None),
            "claimed_delta": claims[0]["metric"].split("delta=")[-1] if claims else None,
            "eps_lb_roc": max((r["value"] for r in roc), default=None),
            "eps_lb_one_run": max((r["value"] for r in one), default=None),
            "eps_lb_at_claim": max((r["ci_low"] for r in claims), default=None),
            "claimed_kl": max((r["value"] for r in kl_claims), default=None),
            "kl_lb": max([r["value"] for r in kl] + [r["ci_low"] for r in kl_claims], default=None),
            "confidence": round(1.0 - len(attacks) * (1.0 - c), 6),
            "attacks": len(attacks), "canaries": (one or roc)[0]["n_pos"] + (one or roc)[0]["n_neg"] if one or roc
            else None,
            "verdict": verdict,
        })
    return out
