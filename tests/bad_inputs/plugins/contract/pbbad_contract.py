"""Plugins that break the contract outside ``score`` (tests/test_bad_inputs.py), installed through entry points.

Each is what a careless or dishonest plugin does at another point the runner calls it: a defense that crashes or
forgets its ``return`` or releases a diverged (NaN) model, an attack whose ``metrics`` hook crashes or whose scores come back as a matrix, a task whose
``build`` crashes or returns the wrong thing. Every one must fail its run with one line naming the plugin.
"""

import numpy as np
import torch

from bench.attack import Attack
from bench.defense import Adapted, Defense
from bench.task import Task


class MetricsRaise(Attack):
    name = "pbbad_metrics"
    version = "0.1"
    description = "Scores fine, then crashes in its metrics hook."

    def score(self, view):
        return np.zeros(len(view.targets))

    def metrics(self, labels, output, ctx):
        raise KeyError("simulated crash inside metrics")


class TwoDimensional(Attack):
    name = "pbbad_2d"
    version = "0.1"
    description = "Returns its scores as a (n/2, 2) matrix: the right count, but no longer one per target."

    def score(self, view):
        n = len(view.targets)
        return np.zeros((n // 2, 2)) if n % 2 == 0 else np.zeros((n, 1))


class DefenseRaises(Defense):
    name = "pbbad_def_raise"
    version = "0.1"
    description = "Crashes inside adapt."

    def adapt(self, model, data, ctx):
        raise ValueError("simulated crash inside the defense")


class DefenseReturnsNothing(Defense):
    name = "pbbad_def_none"
    version = "0.1"
    description = "Trains nothing and forgets to return."

    def adapt(self, model, data, ctx):
        model.eval()


class DefenseReleasesNaN(Defense):
    name = "pbbad_def_nan"
    version = "0.1"
    description = "Releases a model whose weights are NaN: a diverged training run."

    def adapt(self, model, data, ctx):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        return Adapted(model, {"diverged": True})


class TaskRaises(Task):
    name = "pbbad_task_raise"
    version = "0.1"
    description = "Its source is unreachable."

    def build(self, cache=None):
        raise OSError("simulated: task source unreachable")


class TaskReturnsDict(Task):
    name = "pbbad_task_dict"
    version = "0.1"
    description = "Returns a plain dict instead of TaskData."

    def build(self, cache=None):
        return {"pretrain": [], "adapt": []}
