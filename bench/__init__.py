"""privbench core: game, language-model API, training, registry, runner, metrics, store."""

__version__ = "0.5.1"
