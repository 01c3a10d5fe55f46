"""A plugin module that imports, but its entry point names a class that does not exist."""

from bench.attack import Attack


class MisspeltAttack(Attack):  # the entry point says MisspelledAttack
    name = "pbbad_typo"

    def score(self, view):
        return [0.0] * len(view.targets)
