"""RMIA (Marek et al. 2026, Algorithm 1) against a loop-by-loop transcription of the algorithm (with privbench's
line 8: the same offline mix for z as for x)."""

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


def test_with_tie_break_the_ranking_is_the_loss_ratio_whatever_gamma_and_z():
    """Ratio_z does not depend on x, so the count falls with Ratio_x for every target alike; the tie-break completes
    that order. AUC and TPR@1%FPR then equal those of −Ratio_x for every γ and Z; without it they move."""
    from bench.metrics import roc_auc, tpr_at_fpr
    rng = np.random.default_rng(4)
    n = 400
    labels = np.r_[np.ones(n // 2), np.zeros(n // 2)]
    tx = rng.uniform(2, 5, n) - 0.3 * labels          # members: lower target loss
    rx = rng.uniform(2, 5, (2, n))
    ratio = tx / (0.5 * (rx.mean(0) + 1.0))           # α = 0
    want_auc, want_tpr = roc_auc(labels, -ratio), tpr_at_fpr(labels, -ratio, 0.01)[0]
    plain_aucs = set()
    for gamma in (0.5, 1.0, 2.0):
        for nz in (5, 300):
            tz, rz = rng.uniform(2, 5, nz), rng.uniform(2, 5, (2, nz))
            s = rmia_scores(tx, rx, tz, rz, alpha=0.0, gamma=gamma)
            assert roc_auc(labels, s) == pytest.approx(want_auc, abs=1e-12)
            assert tpr_at_fpr(labels, s, 0.01)[0] == pytest.approx(want_tpr, abs=1e-12)
            plain_aucs.add(round(roc_auc(labels, rmia_scores(tx, rx, tz, rz, alpha=0.0, gamma=gamma,
                                                             tie_break=False)), 9))
    assert len(plain_aucs) > 1  # the coarse count of the paper does depend on γ and Z


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
    assert RMIAAttack().alpha == 0.0  # Marek et al., appendix H
    attack = RMIAAttack(alpha=None)
    scores = np.asarray(attack.score(view))
    assert scores[:30].mean() > scores[30:].mean()
    assert attack.last_tuning["tuned"] and attack.last_tuning["alpha"] in attack.alpha_grid
    # tuning touched only shadow models: the released model was asked only about targets and Z
    assert all(n in (60, 90) for _, n in target.calls)


# -- end to end on a real (tiny) transformer: scores recomputed independently from float64 forwards ----------------

def _privacy_meter_offline(loss_target_x, loss_refs_x, loss_target_z, loss_refs_z, a, gamma):
    """Offline RMIA in loss space (Marek et al. 2026, Algorithm 1, with Privacy Meter's offline mix on both x
    and z), written per target as 'the share of population samples z that x dominates'."""
    out = []
    for i in range(len(loss_target_x)):
        px = ((1 + a) / 2) * np.mean([r[i] for r in loss_refs_x]) + (1 - a) / 2
        wins = 0
        for j in range(len(loss_target_z)):
            pz = ((1 + a) / 2) * np.mean([r[j] for r in loss_refs_z]) + (1 - a) / 2
            wins += (loss_target_x[i] / px) / (loss_target_z[j] / pz) < gamma
        out.append(wins / len(loss_target_z))
    return np.array(out)


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    import copy as _copy

    import torch
    from transformers import AutoTokenizer

    from bench.modeling import ModelSpec, build_scratch_model
    from bench.tokenizer import train_bpe_tokenizer
    from bench.training import train_causal_lm
    from tests.worlds import synthetic_corpus as _corpus

    torch.set_num_threads(1)
    corpus = _corpus(240, seed=5)
    d = tmp_path_factory.mktemp("rmia-bpe")
    train_bpe_tokenizer(corpus, d, vocab_size=512)
    tok = AutoTokenizer.from_pretrained(str(d))
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=64, vocab_size=512)
    enc = lambda ts: [([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"])[:64] for t in ts]  # noqa
    base = build_scratch_model(spec, tok, seed=0)
    train_causal_lm(base, enc(corpus[:100]), epochs=1, lr=3e-3, batch_size=8, seed=0, pad_id=tok.pad_token_id,
                    progress=False)

    def adapted(texts, seed):
        m = _copy.deepcopy(base)
        train_causal_lm(m, enc(texts), epochs=6, lr=3e-3, batch_size=8, seed=seed, pad_id=tok.pad_token_id,
                        progress=False)
        return m.eval()

    members, non = corpus[100:112], corpus[112:124]
    slices = (tuple(corpus[124:148]), tuple(corpus[148:172]))
    z = tuple(corpus[172:200])
    return dict(tok=tok, target=adapted(members, 1), shadows=[adapted(list(s), 2 + i) for i, s in enumerate(slices)],
                slices=slices, z=z, texts=members + non, labels=np.r_[np.ones(12), np.zeros(12)])


def _losses64(model, tok, texts):
    import copy as _copy

    import torch
    m = _copy.deepcopy(model).double().eval()
    out = []
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"])[:64]])
            lp = torch.log_softmax(m(ids).logits[0, :-1], -1)[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
            out.append(-float(lp.mean()))
    return np.array(out)


def _tiny_view(w):
    from bench.lm import HFLanguageModel
    caps = frozenset({"token_logprobs"})
    wrap = lambda m, fp: RestrictedModel(HFLanguageModel(m, w["tok"], fingerprint=fp, max_length=64,  # noqa: E731
                                                         batch_size=5), caps, "x")
    return AttackerView("adapt", tuple(Target(str(i), t) for i, t in enumerate(w["texts"])), wrap(w["target"], "t"),
                        None, None, None, ShadowSet(tuple(wrap(m, f"s{i}") for i, m in enumerate(w["shadows"])),
                                                    w["slices"], w["z"], "attacker reference"))


@pytest.mark.parametrize("alpha,gamma", [(0.3, 1.0), (1.0, 1.0), (0.6, 0.95)])
def test_rmia_on_a_tiny_transformer_matches_independent_offline_scores(tiny_world, alpha, gamma):
    w = tiny_world
    tx, tz = _losses64(w["target"], w["tok"], w["texts"]), _losses64(w["target"], w["tok"], w["z"])
    rx = [_losses64(m, w["tok"], w["texts"]) for m in w["shadows"]]
    rz = [_losses64(m, w["tok"], w["z"]) for m in w["shadows"]]
    want = _privacy_meter_offline(tx, rx, tz, rz, alpha, gamma)
    view = _tiny_view(w)
    got = np.asarray(RMIAAttack(alpha=alpha, gamma=gamma, tie_break=False).score(view))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert len(np.unique(want)) > 3        # a non-degenerate check: the counts vary across targets
    broken = np.asarray(RMIAAttack(alpha=alpha, gamma=gamma).score(view))
    assert np.all((broken - want >= 0) & (broken - want < 0.5 / len(w["z"]) + 1e-12))


def test_rmia_alpha_tuning_on_a_tiny_transformer_matches_independent_search(tiny_world):
    from sklearn.metrics import roc_auc_score

    w = tiny_world
    grid = [0.0, 0.25, 0.5, 0.75, 1.0]
    z = list(w["z"])
    z_pop, z_out = z[: len(z) // 2], z[len(z) // 2:]
    mean_auc = {}
    for a in grid:
        aucs = []
        for i in range(2):
            j = 1 - i
            x = list(w["slices"][i][:8]) + z_out
            labels = np.r_[np.ones(8), np.zeros(len(z_out))]
            s = _privacy_meter_offline(_losses64(w["shadows"][i], w["tok"], x),
                                       [_losses64(w["shadows"][j], w["tok"], x)],
                                       _losses64(w["shadows"][i], w["tok"], z_pop),
                                       [_losses64(w["shadows"][j], w["tok"], z_pop)], a, 1.0)
            aucs.append(roc_auc_score(labels, s))
        mean_auc[a] = float(np.mean(aucs))
    best = max(grid, key=lambda a: (mean_auc[a], -a))     # ties go to the smallest α, as privbench's max() over sorted
    attack = RMIAAttack(alpha=None, alpha_grid=grid, tune_members=8, tie_break=False)
    alpha, info = attack.tuned_alpha(_tiny_view(w).shadows)
    assert info["tuned"] and alpha == best
    for a in grid:
        assert info["shadow_auc"][a] == pytest.approx(mean_auc[a], abs=1e-9)
