"""Errors raised at the edges (configuration, URLs)."""

from statebook.lifecycle import StatebookError


class ConfigError(StatebookError, ValueError):
    """A setting, URL or configuration file is invalid."""
