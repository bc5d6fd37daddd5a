"""Number formatting shared by every renderer (text report, app)."""

from __future__ import annotations

from typing import Any


def ms(us: Any) -> str:
    """Microseconds as milliseconds."""
    return "n/a" if us is None else f"{us / 1000:,.2f} ms"


def pct(fraction: Any) -> str:
    return "n/a" if fraction is None else f"{fraction:.1%}"


def mib(nbytes: Any) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**20:,.1f} MiB"
