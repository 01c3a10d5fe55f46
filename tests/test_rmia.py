"""RMIA (source 004 Algorithm 1) against a literal, loop-by-loop transcription of the algorithm."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.rmia import RMIAAttack, rmia_scores
from bench.game import AttackerView, ShadowSet, Target
from bench.lm import RestrictedModel
from tests.fakes import UnigramLM


def algorithm_1(target_loss_x, ref_losses_x, target_loss_z, ref_losses_z, alpha, gamma):
    """Algorithm 1, line by line: one target x, k reference models, population Z."""
    k = len(ref_losses_x)
    l_out_x = sum(ref_losses_x) / k                                # line 3
    l_x = 0.5 * ((1 + alpha) * l_out_x + (1 - alpha))              # line 4
    ratio_x = target_loss_x / l_x                                   # line 5
    c = 0
    for zi in range(len(target_loss_z)):                            # line 6
        l_z = sum(r[zi] for r in ref_losses_z) / k                  # line 7
        ratio_z = target_loss_z[zi] / (0.5 * ((1 + alpha) * l_z + (1 - alpha)))  # line 8 (same offline mix)
        if ratio_x / ratio_z < gamma:                               # line 9
            c += 1                                                  # line 10
    return c / len(target_loss_z)                                   # line 13


@pytest.mark.parametrize("alpha,gamma,k", [(0.0, 1.0, 1), (0.3, 1.0, 2), (1.0, 0.8, 3), (0.5, 1.5, 2)])
def test_vectorised_scores_equal_algorithm_1(alpha, gamma, k):
    rng = np.random.default_rng(0)
    n, nz = 40, 57
    tx, tz = rng.uniform(1, 6, n), rng.uniform(1, 6, nz)
    rx, rz = rng.uniform(1, 6, (k, n)), rng.uniform(1, 6, (k, nz))
    got = rmia_scores(tx, rx, tz, rz, alpha=alpha, gamma=gamma, tie_break=False)
    want = [algorithm_1(tx[i], [rx[r, i] for r in range(k)], tz, [rz[r] for r in range(k)], alpha, gamma)
            for i in range(n)]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_tie_break_orders_within_a_count_only():
    rng = np.random.default_rng(1)
    tx, tz = rng.uniform(1, 6, 300), rng.uniform(1, 6, 20)
    rx, rz = rng.uniform(1, 6, (1, 300)), rng.uniform(1, 6, (1, 20))
    plain = rmia_scores(tx, rx, tz, rz, alpha=0.3, gamma=1.0, tie_break=False)
    broken = rmia_scores(tx, rx, tz, rz, alpha=0.3, gamma=1.0, tie_break=True)
    assert len(np.unique(plain)) <= 21 < len(np.unique(broken))
    # every strict order of the original counts is preserved
    i, j = np.nonzero(plain[:, None] > plain[None, :])
    assert np.all(broken[i] > broken[j])
    # within a count, a lower loss ratio ranks higher (more likely member)
    same = plain == plain[0]
    ratio = tx / (0.5 * (1.3 * rx[0] + 0.7))
    order = np.argsort(broken[same])
    assert np.all(np.diff(ratio[same][order]) <= 1e-12)


def test_members_score_higher_and_alpha_is_tuned_on_shadows_only():
    """Shadows and the target are unigram models; the target was fitted on the member texts."""
    rng = np.random.default_rng(2)
    vocab = "abcdefghijklmnopqrstuvwxyz "
    text = lambda: "".join(rng.choice(list(vocab), size=60, p=None))  # noqa: E731
    pop = [text() for _ in range(200)]
    members, non = [text() + " zq" * 5 for _ in range(30)], [text() for _ in range(30)]
    target = UnigramLM(pop[:50] + members * 3)
    shadow_slices = (tuple(pop[50:80]), tuple(pop[80:110]))
    shadows = [UnigramLM(pop[:50] + list(sl) * 3) for sl in shadow_slices]
    caps = frozenset({"token_logprobs"})
    view = AttackerView("adapt", tuple(Target(str(i), t) for i, t in enumerate(members + non)),
                        RestrictedModel(target, caps, "released"), None, None, None,
                        ShadowSet(tuple(RestrictedModel(m, caps, "shadow") for m in shadows), shadow_slices,
                                  tuple(pop[110:200]), "attacker reference"))
    attack = RMIAAttack()
    scores = np.asarray(attack.score(view))
    assert scores[:30].mean() > scores[30:].mean()
    assert attack.last_tuning["tuned"] and attack.last_tuning["alpha"] in attack.alpha_grid
    # tuning touched only shadow models: the released model was asked only about targets and Z
    assert all(n in (60, 90) for _, n in target.calls)
