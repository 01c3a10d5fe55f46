"""The conformance kit: `privbench validate`'s checks as pytest cases for a plugin author's own tests."""

from __future__ import annotations

import numpy as np
import pytest

from bench.attack import Attack
from bench.conformance import parametrize_with_checks, plugin_checks
from bench.registry import ATTACKS, DEFENSES


@parametrize_with_checks([ATTACKS.get("loss"), ATTACKS.get("min_k"), DEFENSES.get("finetune"), DEFENSES.get("none")])
def test_builtin_plugins_pass_the_kit(plugin, check):
    check(plugin)


class BadVersion(Attack):
    """Scores nothing useful, and its version is not a version string."""

    version = "latest"
    description = "scores nothing useful"

    def score(self, view):
        return np.zeros(len(view.targets))


def test_the_kit_names_the_problem_and_the_fix():
    failing = []
    for name, check in plugin_checks(BadVersion):
        try:
            check(BadVersion)
        except AssertionError as exc:
            failing.append(str(exc))
    assert failing == ["FAIL  version: version 'latest' is not a version string: set a class attribute like "
                       "version = \"0.1.0\" and bump it when results change"], failing


def test_the_tiny_world_run_checks_a_real_run(cache):
    checks = dict(plugin_checks(DEFENSES.get("none"), run=True, cache=cache.root))
    checks["tiny world"](DEFENSES.get("none"))   # releases θ: a finite held-out loss


def test_a_non_plugin_is_refused():
    with pytest.raises(AssertionError, match="neither an Attack nor a Defense"):
        plugin_checks(int)
