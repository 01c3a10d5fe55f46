"""Tests for tasks.distance: exact W1 on toy point clouds, embeddings, and a small real distance report."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import wasserstein_distance

from bench.cache import ArtifactCache
from bench.errors import ConfigError, DataError
from tasks import distance
from tasks.distance import (EMBED_DIM, check_ood_farther, distance_report, embed, ood_farther_than_iid,
                            sample_texts, wasserstein1)

# Two pile subsets over mini_pile's mixture (stdlib code + Shakespeare), small budget: a few seconds to build.
SMALL = {"pretrain_sources": ["stdlib_code", "shakespeare"], "max_chars_per_source": 100_000}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # one cache per test session, shared with test_data_cli: builds and embeddings are done once
    return ArtifactCache(tmp_path_factory.getbasetemp() / "privbench-data-cache")


@pytest.fixture(scope="module")
def model():
    try:
        return distance.load_model()
    except DataError as exc:
        pytest.skip(f"sentence-embedding model unavailable ({exc})")


# ------------------------------------------------------------------------------------------ W1

def test_w1_one_dimensional_hand_computed():
    # sorted matching 0->1, 2->5: (1 + 3) / 2 = 2 (the crossed matching would cost (5 + 1) / 2 = 3)
    assert wasserstein1([0.0, 2.0], [5.0, 1.0]) == pytest.approx(2.0)
    x = np.array([0.0, 1.0, 2.0, 3.0])
    assert wasserstein1(x, x + 0.5) == pytest.approx(0.5)


def test_w1_of_a_shifted_copy_is_the_shift():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    assert wasserstein1(x, x + np.array([3.0, 4.0])) == pytest.approx(5.0)
    y = rng.normal(size=(30, 16))
    shift = rng.normal(size=16)
    assert wasserstein1(y, y + shift) == pytest.approx(float(np.linalg.norm(shift)))


def test_w1_symmetric_and_zero_on_identical_sets():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(25, 5)), rng.normal(loc=0.3, size=(25, 5))
    assert wasserstein1(x, y) == pytest.approx(wasserstein1(y, x))
    assert wasserstein1(x, y) > 0
    assert wasserstein1(x, x) == pytest.approx(0.0, abs=1e-12)
    assert wasserstein1(x, x[rng.permutation(25)]) == pytest.approx(0.0, abs=1e-12)


def test_w1_unequal_sizes_solves_the_transport_lp_exactly():
    rng = np.random.default_rng(2)
    u, v = rng.normal(size=7), rng.normal(loc=1.0, size=12)
    assert wasserstein1(u, v) == pytest.approx(wasserstein_distance(u, v), abs=1e-9)
    assert wasserstein1(v, u) == pytest.approx(wasserstein1(u, v), abs=1e-9)


def test_w1_rejects_mismatched_or_empty_sets():
    with pytest.raises(ConfigError):
        wasserstein1(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ConfigError):
        wasserstein1(np.zeros((0, 2)), np.zeros((3, 2)))


def test_sample_texts_is_seeded_ordered_and_capped():
    texts = [f"t{i}" for i in range(50)]
    a = sample_texts(texts, 10, 0, "pool")
    assert a == sample_texts(texts, 10, 0, "pool")
    assert a != sample_texts(texts, 10, 1, "pool")
    assert a == sorted(a, key=texts.index) and len(set(a)) == 10
    assert sample_texts(texts[:4], 10, 0, "pool") == texts[:4]


def test_acceptance_check_reports_violations():
    def row(split, relation, w):
        return {"split": split, "relation": relation, "w_mean": w, "w_min": w}

    good = [row("a", "iid", 0.5), row("b", "overlap", 0.4), row("c", "ood", 0.9)]
    assert ood_farther_than_iid(good)
    bad = good + [row("d", "ood", 0.45)]
    check = check_ood_farther(bad, "w_min")
    assert check["holds"] is False and check["violations"] == [("a", "d")]
    assert check["min_far"] == 0.45 and check["max_near"] == 0.5
    assert not ood_farther_than_iid(bad)
    assert check_ood_farther(good[:2], "w_min")["holds"] is None
    assert not ood_farther_than_iid(good[:2])


# ------------------------------------------------------------------------------------------ embeddings

def test_embed_shape_normalised_and_cached(model, cache, monkeypatch):
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "def f(x):\n    return x + 1"]
    vecs = embed(texts, cache=cache)
    assert vecs.shape == (3, EMBED_DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.3  # a sentence model, not noise
    monkeypatch.setattr(distance, "load_model", lambda: pytest.fail("a cached embedding loaded the model"))
    assert np.array_equal(embed(texts, cache=cache), vecs)
    assert embed([], cache=cache).shape == (0, EMBED_DIM)


def test_small_report_puts_ood_dialogue_farther_than_iid_books(model, cache):
    rows = distance_report([("pile_subset:books", SMALL), ("pile_subset:dialogue_en", SMALL)], n=24, seed=0,
                           cache=cache)
    books, dialogue = rows
    assert (books["relation"], dialogue["relation"]) == ("iid", "ood")
    for r in rows:
        assert r["n"] == 24 and r["n_pretrain"] == 24
        assert set(r) >= {"split", "relation", "n", "w_mean", "w_min", "w_all", "w:stdlib_code", "w:shakespeare"}
        assert r["w_min"] == min(r["w:stdlib_code"], r["w:shakespeare"])
        assert r["w_mean"] == pytest.approx((r["w:stdlib_code"] + r["w:shakespeare"]) / 2)
    assert books["nearest"] == "shakespeare"  # the books pool is held-out Shakespeare
    assert dialogue["w_mean"] > books["w_mean"] and dialogue["w_min"] > books["w_min"]
    assert ood_farther_than_iid(rows)
    assert distance_report([("pile_subset:books", SMALL)], n=24, cache=cache)[0] == books  # seeded, cached


def test_report_rejects_bad_arguments(cache):
    with pytest.raises(ConfigError):
        distance_report(["pile_subset:books"], n=1, cache=cache)
    with pytest.raises(ConfigError):
        distance_report(["pile_subset:books"], pool="heldout", cache=cache)
