"""Number formatting shared by every renderer (text report, app)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kinetoscope.analyze.model.findings import Worth


def ms(us: Any) -> str:
    """Microseconds as milliseconds."""
    return "n/a" if us is None else f"{us / 1000:,.2f} ms"


def pct(fraction: Any) -> str:
    return "n/a" if fraction is None else f"{fraction:.1%}"


def mib(nbytes: Any) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**20:,.1f} MiB"


def number(value: Any) -> str:
    """A plain number as a person reads it: four significant digits, thousands separated, never in exponent form
    (3146000.0 -> '3,146,000', 12.3456 -> '12.35', 0.012345 -> '0.01235', 2.0 -> '2', 0.5 -> '0.5'); 'n/a' for
    unknown."""
    import math

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    v = float(value)
    decimals = max(0, 3 - int(math.floor(math.log10(abs(v))))) if v else 0
    text = f"{v:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def listing(pairs: Any, unit: str = "", limit: int = 12) -> str:
    """(label, number) pairs as words, for a chart's text alternative: 'data wait 68.69 ms, h2d 2.1 ms, … (40 in
    all)'."""
    pairs = list(pairs)
    shown = [f"{label} {number(value)}{(' ' + unit) if unit else ''}" for label, value in pairs[:limit]]
    return ", ".join(shown) + (f", … ({len(pairs)} in all)" if len(pairs) > limit else "")


def rank_ranges(ranks: Any) -> str:
    """Rank numbers as a person reads them: [2] -> '2', [0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    ranks = sorted(int(r) for r in ranks)
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)


def missing_ranks_text(job: dict[str, Any]) -> str | None:
    """What a job misses, in a sentence, or None when it has every rank it names."""
    missing = job.get("missing_ranks") or []
    if not missing:
        return None
    n, size = len(missing), job.get("world_size")
    return (f"{n:,} of the job's {size:,} ranks have no file (rank{'s' if n > 1 else ''} {rank_ranges(missing)}): "
            "nothing is claimed about the whole job (its straggler); what the ranks given show is shown")


def worth(estimate: Mapping[str, Any] | None, judged: Worth | None = None) -> str | None:
    """What fixing a finding is worth, as one line: 'fix this: ~12.30 ms per step faster (34%)'. ``judged``: the
    finding's ``Worth``, what its severity was judged by; where that is a cost the capture measured over every step
    of the run (``scope`` "run"), it is said too - the window's estimate alone could read 0% beside a critical
    measured over the run."""
    line = _estimate_line(estimate)
    if judged is not None and judged.scope == "run" and judged.fraction is not None:
        over = f"over the run: {judged.fraction:.1%} of {judged.of}"
        return (f"{line}; {over}" if line
                else f"fix this: from the capture's timings over the run, not the window's; {over}")
    return line


def _estimate_line(estimate: Mapping[str, Any] | None) -> str | None:
    if not estimate:
        return None
    if estimate.get("method") == "none":
        oom = estimate.get("steps_to_out_of_memory")
        tail = f"; out of memory in ~{oom:,} steps as it grows" if isinstance(oom, int) else ""
        return f"fix this: no step-time change expected ({(estimate.get('assumptions') or [''])[0]}){tail}"
    saving, share = estimate.get("saving_us_per_step"), estimate.get("saving_fraction")
    if estimate.get("method") == "one-off":
        return (f"fix this: a one-off {estimate['one_off_total_us'] / 1000:,.1f} ms in all; over "
                f"{estimate['amortised_over_steps']:,} steps ~{(saving or 0) / 1000:,.2f} ms per step ({share:.1%} of "
                "their mean step)")
    workers = estimate.get("num_workers")
    cpus = estimate.get("cpus")
    assumed = ("" if workers is None else
               f" with num_workers={workers}" + (f" on {cpus} CPUs" if cpus else " (the host's CPUs are not recorded)"))
    bound = " at most" if estimate.get("bound") == "upper" else ""
    if not saving:
        limit = estimate.get("limited_by")
        return f"fix this{assumed}: no measurable step-time change expected" + (f" ({limit})" if limit else "")
    if saving < 0:  # the fix as estimated costs more than it saves (a hand-over dearer than the wait it removes)
        return (f"fix this{assumed}: ~{-saving / 1000:,.2f} ms per step slower ({-(share or 0):.0%}; "
                f"{estimate['step_us_after'] / 1000:,.2f} ms per step after)")
    return (f"fix this{assumed}:{bound} ~{saving / 1000:,.2f} ms per step faster ({share:.0%}; "
            f"{estimate['step_us_after'] / 1000:,.2f} ms per step after)")


def _name(key: str) -> str:
    for suffix in ("_us", "_bytes", "_fraction", "_share"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def _is_timestamp(key: str) -> bool:
    """A key holding a point on the trace's clock (start_us, ts_us, end_ns): meaningless to a reader as is."""
    return key.endswith(("_us", "_ns")) and key.split("_")[0] in _TIMESTAMPS


def _value(key: str, value: Any) -> str:
    """One evidence value as text, its unit from its key's suffix; dicts and lists item by item, the same way."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and key.endswith("_us"):
        return ms(value)
    if isinstance(value, (int, float)) and key.endswith("_bytes"):
        return mib(value)
    if isinstance(value, (int, float)) and (key.endswith(("fraction", "_share")) or "fraction_of" in key):
        return pct(value)
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, dict):
        items = [f"{_name(k)} {_value(k, v)}" for k, v in list(value.items())[:8] if not _is_timestamp(str(k))]
        return ", ".join(items) or "none"
    if isinstance(value, (list, tuple)):
        shown = [_value(key, x) for x in value[:5]]
        return "; ".join(shown) + (f"; … ({len(value)} in all)" if len(value) > 5 else "") if shown else "none"
    if isinstance(value, str):
        return value.replace("_", " ") if value.isidentifier() else value
    return str(value)


def evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """A finding's evidence as readable lines ('loader time: 415.79 ms'), units taken from the key's suffix, in
    nested values too; points on the trace's clock (start_us ...) left out."""
    return [f"{_name(key)}: {_value(key, value)}" for key, value in evidence.items() if not _is_timestamp(key)]


#: how a column's unit suffix is shown, and the name it loses the suffix for
_TIMESTAMPS = ("start", "end", "ts")


def display_table(frame: Any, window_start_ns: int | None = None) -> tuple[Any, dict[str, Any]]:
    """An analysis table as a person reads it: ``*_us``/``*_ns`` durations in ms, timestamps (``start_*``,
    ``end_*``, ``ts_*``) in ms from the window start (never raw trace clock), ``*_bytes`` in MiB, ``*_fraction`` as
    a percentage; names without their suffix, with the unit ("busy (ms)"). Returns the table and the Styler
    formats for ``st.dataframe(table.style.format(formats))``. A duplicate name (``start_ns`` and ``start_us``)
    keeps the first."""
    import pandas as pd

    out: dict[str, Any] = {}
    formats: dict[str, Any] = {}
    for col in frame.columns:
        values = frame[col]
        base, unit = col, None
        for suffix in ("_us", "_ns", "_bytes", "_fraction", "_mib", "_ms", "_ms_per_step", "_s"):
            if col.endswith(suffix):
                base, unit = col[: -len(suffix)], suffix
                break
        if col == "fraction":
            base, unit = "share", "_fraction"
        if base == "ts":
            base = "start"
        label = base.replace("_", " ")
        stamp = unit in ("_us", "_ns") and base.split("_")[0] in _TIMESTAMPS
        if unit in ("_us", "_ns"):
            scale = 1e3 if unit == "_us" else 1e6
            numbers = pd.to_numeric(values, errors="coerce")
            if stamp:
                if window_start_ns is None:
                    continue  # a raw trace-clock timestamp means nothing to a reader
                origin = window_start_ns if unit == "_ns" else window_start_ns / 1000
                # integers subtracted exactly first: epoch nanoseconds do not fit a float's 53 bits
                numbers = (numbers - (int(origin) if numbers.dtype.kind == "i" else origin))
                label = f"{label} (ms from window start)"
            else:
                label = f"{label} (ms)"
            values = numbers.astype("float64") / scale
            formats[label] = "{:,.3f}"
        elif unit in ("_bytes", "_mib"):
            values = pd.to_numeric(values, errors="coerce").astype("float64") / (2**20 if unit == "_bytes" else 1)
            label = f"{label} (MiB)"
            formats[label] = "{:,.2f}"
        elif unit == "_fraction":
            label = f"{label} (%)"
            formats[label] = "{:.1%}"
        elif unit in ("_ms", "_ms_per_step", "_s"):
            label = f"{label} ({ {'_ms': 'ms', '_ms_per_step': 'ms/step', '_s': 's'}[unit] })"
            formats[label] = "{:,.3f}"
        elif col in ("cause", "phase") and (values.dtype == object or pd.api.types.is_string_dtype(values)):
            values = values.map(lambda v: v.replace("_", " ") if isinstance(v, str) else v)
        elif col == "bytes":
            formats[label] = "{:,.0f}"
        if label not in out:
            out[label] = values.to_numpy() if hasattr(values, "to_numpy") else values
    return pd.DataFrame(out), formats


def series_label(column: str) -> str:
    """A column name as a legend entry: 'data_wait_us' -> 'data wait'."""
    for suffix in ("_us", "_ns", "_bytes", "_fraction", "_mib", "_ms"):
        if column.endswith(suffix):
            column = column[: -len(suffix)]
    return column.replace("_", " ")


def compare_display(table: Any) -> Any:
    """``analyze.compare.compare_reports``' table as a person reads it: each metric in its unit (ms, %, MiB per the
    unit its label names), the change as a signed percentage, and whether that is better or worse in words."""
    import pandas as pd

    def one(label: str, v: Any) -> str:
        if v is None or v != v:
            return "n/a"
        if "(us)" in label:
            return f"{v / 1000:,.2f} ms"
        if "fraction" in label:
            return f"{v:.1%}"
        if "bytes" in label:
            return f"{v / 2**20:,.1f} MiB" + ("/step" if "/step" in label else "")
        return number(v)

    names = {"(us)": "", "(bytes/step)": "", "(bytes)": "", ", fraction of window": " (share of the window)",
             ", fraction of copy time": " (share of copy time)"}

    def name(label: str) -> str:
        for k, v in names.items():
            label = label.replace(k, v)
        return label.strip()

    return pd.DataFrame({
        "metric": [name(m) for m in table["metric"]],
        "before": [one(m, v) for m, v in zip(table["metric"], table["before"], strict=False)],
        "after": [one(m, v) for m, v in zip(table["metric"], table["after"], strict=False)],
        "change": ["" if c is None or c != c else "0.0%" if abs(c) < 0.0005 else f"{c:+.1%}" for c in table["change"]],
        "verdict": ["" if b is None or b != b else "better" if b else "worse" for b in table["better"]],
    })
