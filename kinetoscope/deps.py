"""Optional dependencies: an option or command that needs one says so in one line (a usage error)."""

from __future__ import annotations

import importlib

from kinetoscope.errors import ConfigError


def require(module: str, what: str, extra: str) -> None:
    """Import ``module`` or raise a one-line ConfigError naming ``what`` needs it and how to install it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{what} needs {module}: pip install 'kinetoscope[{extra}]' (or pip install {module})"
        ) from None
