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


def evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """A finding's evidence as readable lines ('loader time: 415.79 ms'), units taken from the key's suffix."""
    out = []
    for key, value in evidence.items():
        name = key
        for suffix in ("_us", "_bytes", "_fraction", "_share"):
            if key.endswith(suffix):
                name = key[: -len(suffix)]
        name = name.replace("_", " ")
        if value is None:
            text = "unknown"
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, (int, float)) and key.endswith("_us"):
            text = ms(value)
        elif isinstance(value, (int, float)) and key.endswith("_bytes"):
            text = mib(value)
        elif isinstance(value, (int, float)) and key.endswith(("fraction", "_share")) or "fraction_of" in key:
            text = pct(value) if isinstance(value, (int, float)) else str(value)
        elif isinstance(value, float):
            text = f"{value:,.4g}"
        elif isinstance(value, int):
            text = f"{value:,}"
        elif isinstance(value, (list, tuple)):
            shown = [", ".join(f"{k} {v}" for k, v in x.items()) if isinstance(x, dict) else str(x) for x in value[:5]]
            text = "; ".join(shown) + (f"; … ({len(value)} in all)" if len(value) > 5 else "") if shown else "none"
        elif isinstance(value, dict):
            text = ", ".join(f"{k} {v}" for k, v in list(value.items())[:8]) or "none"
        else:
            text = str(value)
        out.append(f"{name}: {text}")
    return out
