"""Errors of the core that more than one module raises."""

from __future__ import annotations


class SettingsError(ValueError):
    """The settings file or an environment variable is invalid; the message says which."""
