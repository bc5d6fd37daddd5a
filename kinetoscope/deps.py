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


def _pandas_major() -> int | None:
    """The installed pandas' major version, read from its dist-info folder's name without importing it (a few ms,
    where importlib.metadata costs ~25); None when it cannot be told."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("pandas")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    found = Path(spec.origin).parent.parent.glob("pandas-*.dist-info")
    majors = {p.name.split("-")[1].split(".")[0] for p in found}
    return int(majors.pop()) if len(majors) == 1 and next(iter(majors)).isdigit() else None


def import_pandas_without_pyarrow() -> bool:
    """In a process the command owns (never a library caller's: pandas would believe pyarrow missing for the rest of
    it), import pandas as on an install without pyarrow, when neither is imported yet and pandas is 3.x (2.x's
    pyarrow hooks break when it is blocked). pyarrow is optional (``app`` and ``cluster`` extras) and the analyses
    never need it; importing it with pandas costs ~0.15 s of CPU and ~38 MB of memory. True if it did."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules or (_pandas_major() or 0) < 3:
        return False
    sys.modules["pyarrow"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import pandas  # noqa: F401
    finally:
        if "pyarrow" in sys.modules and sys.modules["pyarrow"] is None:
            del sys.modules["pyarrow"]
    return True
