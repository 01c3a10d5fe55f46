"""Deliberately broken attack plugins for tests/test_bad_inputs.py, installed through entry points.

The directory holding this module and ``pbbad_attacks-0.1.dist-info`` is put on the path of the
``privbench`` under test, so ``importlib.metadata`` finds the entry points as if the package were
pip-installed. Each class keeps the attack contract's shape but breaks one promise.
"""

import numpy as np

from bench.attack import Attack
from bench.params import Param


class NanAttack(Attack):
    name = "pbbad_nan"
    version = "0.1"
    description = "Returns NaN for every other target (a log of zero, say)."

    def score(self, view):
        scores = np.zeros(len(view.targets))
        scores[::2] = np.nan
        return scores


class ShortAttack(Attack):
    name = "pbbad_short"
    version = "0.1"
    description = "Returns one score fewer than there are targets."

    def score(self, view):
        return np.zeros(len(view.targets) - 1)


class RaisingAttack(Attack):
    name = "pbbad_raise"
    version = "0.1"
    description = "Raises inside score()."

    def score(self, view):
        raise RuntimeError("simulated crash inside the attack")


class BadDefaultAttack(Attack):
    name = "pbbad_knob"
    version = "0.1"
    description = "Declares a float parameter whose default is a string."
    params = (Param("k", float, "twenty", "fraction of tokens (the default is not a number)", low=0.0, high=1.0),)

    def score(self, view):
        return np.full(len(view.targets), self.k * 1.0)
