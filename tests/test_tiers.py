"""The test tiers of tests/conftest.py name real modules: a misspelt name would silently make a slow module a
unit module, so `pytest -m unit` would train models and the parallel run would hand it out last."""

from __future__ import annotations

from pathlib import Path

import conftest


def test_every_tiered_module_exists_and_has_one_tier():
    modules = {path.stem for path in Path(__file__).parent.glob("test_*.py")}
    assert not (conftest.E2E | conftest.INTEGRATION) - modules
    assert not conftest.E2E & conftest.INTEGRATION


def test_slow_tiers_are_collected_first(request):
    tiers = [conftest.TIER_ORDER[conftest._tier(item)] for item in request.session.items]
    assert tiers == sorted(tiers)
