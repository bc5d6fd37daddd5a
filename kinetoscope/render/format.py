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


def worth(estimate: dict[str, Any] | None) -> str | None:
    """What fixing a finding is worth, as one line: 'fix this: ~12.30 ms per step faster (34%)'."""
    if not estimate:
        return None
    if estimate.get("method") == "none":
        oom = estimate.get("steps_to_out_of_memory")
        tail = f"; out of memory in ~{oom:,} steps as it grows" if isinstance(oom, int) else ""
        return f"fix this: no step-time change expected ({(estimate.get('assumptions') or [''])[0]}){tail}"
    saving, share = estimate.get("saving_us_per_step"), estimate.get("saving_fraction")
    if not saving:
        return "fix this: no measurable step-time change expected"
    return (f"fix this: ~{saving / 1000:,.2f} ms per step faster ({share:.0%}; "
            f"{estimate['step_us_after'] / 1000:,.2f} ms per step after)")
