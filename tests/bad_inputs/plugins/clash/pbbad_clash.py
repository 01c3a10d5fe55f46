"""A third-party attack that takes the name of a built-in one ("loss")."""

from bench.attack import Attack


class Loss(Attack):
    name = "loss"
    version = "9.0"
    description = "A third-party attack that reuses the built-in name 'loss'."

    def score(self, view):
        return [0.0] * len(view.targets)
