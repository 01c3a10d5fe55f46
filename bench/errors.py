"""User-facing errors.

Every error a user can cause derives from :class:`PrivbenchError`; the CLI
prints its message on one line and exits non-zero. Messages name the problem
*and* the fix, so they read ``<what is wrong>: <what to do>``.
"""

from __future__ import annotations


class PrivbenchError(Exception):
    """Base class for errors caused by input, configuration or a plugin."""

    exit_code = 2


class ConfigError(PrivbenchError):
    """A suite file, parameter or option is malformed or invalid."""


class RegistryError(PrivbenchError):
    """An unknown or badly registered plugin."""


class DataError(PrivbenchError):
    """A data file or data source is missing, empty, undecodable or too small."""


class PluginError(PrivbenchError):
    """A plugin raised, or returned something that breaks its contract."""

    exit_code = 3


class MetricError(PrivbenchError):
    """Scores or labels cannot give a valid metric (one class only, NaN, ...)."""


class StoreError(PrivbenchError):
    """The results database cannot be opened or written."""


class NoDatabase(StoreError):
    """A command that only reads was pointed at a database file that does not exist."""


class CapabilityError(PrivbenchError):
    """An attack asked for a capability that its game does not release."""
