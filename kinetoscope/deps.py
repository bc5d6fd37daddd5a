"""Optional dependencies: an option or command that needs one says so in one line (a usage error)."""

from __future__ import annotations

import importlib
import sys

from kinetoscope.errors import ConfigError


def require(module: str, what: str, extra: str) -> None:
    """Import ``module`` or raise a one-line ConfigError naming ``what`` needs it and how to install it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{what} needs {module}: pip install 'kinetoscope[{extra}]' (or pip install {module})") from None


def import_pandas_without_pyarrow() -> None:
    """Import pandas as on an install without pyarrow (its plain string columns), when this process has imported
    neither yet. pyarrow is optional (``app`` and ``cluster`` extras) and the analyses never need it; importing it
    with pandas costs ~0.15 s of CPU and ~38 MB of memory. ``import pyarrow`` still works afterwards."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return
    sys.modules["pyarrow"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import pandas  # noqa: F401
    finally:
        if "pyarrow" in sys.modules and sys.modules["pyarrow"] is None:
            del sys.modules["pyarrow"]
