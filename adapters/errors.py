"""Errors raised at the edges (configuration, URLs, what a command finds)."""

from statebook.lifecycle import StatebookError


class ConfigError(StatebookError, ValueError):
    """A setting, URL or configuration file is invalid (the CLI exits 2)."""


class DamagedHistory(StatebookError):
    """An entity's facts cannot be read or do not chain: a finding, like verify's (the CLI exits 1)."""
