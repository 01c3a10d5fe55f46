"""The test tiers of tests/conftest.py name real modules: a misspelt name would silently make a slow module a
unit module, and `pytest -m unit` would train models."""

from __future__ import annotations

from pathlib import Path

import conftest


def test_every_tiered_module_exists_and_has_one_tier():
    modules = {path.stem for path in Path(__file__).parent.glob("test_*.py")}
    assert not (conftest.E2E | conftest.INTEGRATION) - modules
    assert not conftest.E2E & conftest.INTEGRATION

