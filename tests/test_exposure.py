"""Canary exposure estimators against their definitions (Marek et al. 2026, eq. 7 and appendix F)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from attacks.exposure import UNMEMORISED_EXPOSURE, sampling_exposure, skewnorm_exposure
from bench.metrics import exposure_metrics


def test_sampling_exposure_is_log2_candidates_minus_log2_rank():
    refs = np.arange(255, dtype=float)          # 255 references + the canary = 256 candidates
    assert sampling_exposure(1000.0, refs) == pytest.approx(8.0)          # ranked first: log2 256
    assert sampling_exposure(-1.0, refs) == pytest.approx(0.0)            # ranked last
    assert sampling_exposure(127.5, refs) == pytest.approx(8 - np.log2(128))  # 127 references above it


def test_ties_count_half():
    refs = np.array([1.0, 1.0, 0.0])
    assert sampling_exposure(1.0, refs) == pytest.approx(2 - np.log2(1 + 1.0))


def test_unmemorised_canary_has_expected_exposure_1_44():
    rng = np.random.default_rng(0)
    draws = [sampling_exposure(rng.normal(), rng.normal(size=256)) for _ in range(3000)]
    # E[log2(n+1) - log2(rank)] with rank uniform on 1..n+1 tends to 1/ln 2
    assert np.mean(draws) == pytest.approx(UNMEMORISED_EXPOSURE, abs=0.1)


def test_skewnorm_matches_gaussian_tail_on_gaussian_references():
    rng = np.random.default_rng(1)
    refs = rng.normal(loc=-50, scale=3, size=4000)
    for z, tol in ((0.0, 0.1), (2.0, 0.3), (4.0, 1.5)):  # the far tail rests on the fitted skew: looser there
        want = -np.log2(norm.sf(z))
        assert skewnorm_exposure(-50 + 3 * z, refs) == pytest.approx(want, abs=tol)
    # distribution modelling extrapolates past the sample: far above every reference stays finite and large
    assert skewnorm_exposure(0.0, refs) > sampling_exposure(0.0, refs[:256])


def test_exposure_metrics_rows():
    rows = {r.metric: r for r in exposure_metrics([1, 1, 0, 0], [8.0, 6.0, 1.0, 2.0])}
    assert rows["exposure_mean_pos"].value == pytest.approx(7.0)
    assert rows["exposure_mean_neg"].value == pytest.approx(1.5)
    assert rows["exposure_p95_pos"].value == pytest.approx(np.percentile([8.0, 6.0], 95))
    assert rows["exposure_mean_pos"].n_pos == 2
