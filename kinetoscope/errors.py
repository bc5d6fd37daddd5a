"""The exception hierarchy. The CLI turns these into one line and an exit code."""

from __future__ import annotations


class KinetoscopeError(Exception):
    """Something the user can fix: bad input, a bad path, a bad option (exit 2)."""

    exit_code = 2


class TraceFormatError(KinetoscopeError):
    """A file that is not a Kineto/Chrome trace we can analyse."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


class TraceSourceError(KinetoscopeError):
    """A path, directory or set of rank files that cannot form one job."""


class ConfigError(KinetoscopeError):
    """An option or threshold out of its valid range."""


class OutputError(KinetoscopeError):
    """The report cannot be written: standard output closed, a full disk."""
