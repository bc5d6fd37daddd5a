"""The app's one door to Streamlit for everything it shows: text from a trace is text, and secrets are redacted.

Streamlit renders Markdown in titles, captions, alerts, widget labels, option labels, metric values and tooltips.
A trace names things (operators, kernels, files, devices) with any characters it likes: an operator called
``[click](https://evil)`` or ``![x](https://tracker/pixel)`` would become a link, or an image the browser
fetches, and ``__getitem__`` would turn bold. So the screens never import Streamlit: they use ``st`` from here, a
stand-in that passes every string to those parameters through :func:`text` (secrets redacted, whitespace collapsed,
words longer than a screen shortened, Markdown and HTML escaped) unless it is an :class:`Md`: Markdown the app
wrote, made only by :func:`md`, whose template is the app's and whose every argument goes through :func:`text`.
Tables and charts are redacted on their way out (cell by cell, labels too): the grid's own CSV button exports
what it shows. A Streamlit function this door does not know is refused rather than passed through unchecked.
"""

from __future__ import annotations

import functools
import inspect
import re
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pandas as pd
import streamlit as _st

from kinetoscope.analyze.ingest.redact import redact, redact_json_bytes, redact_strings

#: CommonMark/GFM characters that make markup anywhere in a line: escapes, code, emphasis, strikethrough, links and
#: images, HTML and autolinks, entities, math (Streamlit renders $...$)
_INLINE = re.compile(r"([\\`*_~\[\]<>&$|])")
#: what GFM turns into links by itself: scheme://..., www., e-mail addresses
_AUTOLINK = re.compile(r"(?<=[A-Za-z0-9])(:)(?=//)|(?<=\bwww)(\.)|(@)", re.IGNORECASE)
#: what starts a block at the start of a line: headings, lists, quotes, tables, thematic breaks, ordered lists
_BLOCK_START = re.compile(r"^(#{1,6}(?=\s|$)|[-+](?=\s|$)|>|(?:-\s*){3,}$|=+\s*$)|^(\d+)([.)])(?=\s|$)")
#: emoji and icon shortcodes (:smile:, :material/home:) Streamlit replaces after parsing: broken by a zero-width space
_SHORTCODE = re.compile(r":(?=[\w+/-]+:)")
_SPACE = re.compile(r"\s+")
#: a word longer than this (no space to wrap at) is shortened in prose; tables keep every character
LONG_WORD = 300
_LONG = re.compile(rf"\S{{{LONG_WORD + 1},}}")
KEEP = 200


class Md(str):
    """Markdown the app wrote (a template of its own with escaped arguments). Made only by :func:`md`."""


def plain(value: Any) -> str:
    """A value as the text a person should see: secrets redacted, whitespace collapsed, very long words shortened
    (and said so). Not escaped: for places Streamlit shows as text (a selectbox's options)."""
    if value is None:
        return ""
    out = redact_strings([str(value)])[0]
    out = _SPACE.sub(" ", out).strip()
    return _LONG.sub(lambda m: f"{m.group(0)[:KEEP]}… ({len(m.group(0)):,} characters)", out)


def escape(shown: str) -> str:
    """``shown`` as Markdown that renders exactly these characters (no markup, no link, no HTML, no emoji)."""
    out = _SHORTCODE.sub(":\u200b", shown)
    out = _INLINE.sub(r"\\\1", out)
    out = _AUTOLINK.sub(lambda m: "\\" + m.group(0), out)
    return _BLOCK_START.sub(lambda m: "\\" + m.group(1) if m.group(1) else m.group(2) + "\\" + m.group(3), out)


def text(value: Any) -> Md:
    """Any value shown as text inside Markdown: :func:`plain`, then :func:`escape`."""
    if isinstance(value, Md):
        return value
    return Md(escape(plain(value)))


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, Md):
            return format(value, format_spec) if format_spec else value
        return text(format(value, format_spec))


_FORMATTER = _Formatter()


def md(template: str, *args: Any, **kwargs: Any) -> Md:
    """Markdown from the app's own ``template`` (``str.format`` syntax, a literal in the code) with every argument
    shown as text: ``md("**What to do:** {}", finding.recommendation)``."""
    return Md(_FORMATTER.vformat(template, args, kwargs))


def bullets(lines: list[Any]) -> Md:
    """A Markdown list of ``lines``, each shown as text."""
    return Md("\n".join("- " + text(line) for line in lines))


# --- tables and charts --------------------------------------------------------------------------------------------
def redact_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with every string cell, column name and index label redacted (a copy where anything changed)."""
    out = frame
    for col in frame.columns:
        values = frame[col]
        if isinstance(values, pd.DataFrame):  # a duplicated column name: each copy
            continue
        if (values.dtype == object or pd.api.types.is_string_dtype(values)
                or isinstance(values.dtype, pd.CategoricalDtype)):
            cleaned = _redact_series(values)
            if cleaned is not values:
                if out is frame:
                    out = frame.copy()
                out[col] = cleaned
    names = [c for c in out.columns if isinstance(c, str)]
    fixed = dict(zip(names, redact_strings(names), strict=False))
    if any(fixed[c] != c for c in names):
        out = out.rename(columns=fixed)
    if out.index.dtype == object:
        labels = [str(v) for v in out.index]
        cleaned_labels = redact_strings(labels)
        if cleaned_labels != labels:
            out = out.set_axis(cleaned_labels, axis=0)
    return out


def _redact_series(values: pd.Series) -> pd.Series:
    if isinstance(values.dtype, pd.CategoricalDtype):
        cats = [str(c) for c in values.cat.categories]
        cleaned = redact_strings(cats)
        if cleaned == cats:
            return values
        return values.astype(object).map(dict(zip(values.cat.categories, cleaned, strict=False)))
    strings = pd.unique(values[values.map(lambda v: isinstance(v, str))])
    if not len(strings):
        return values
    cleaned = redact_strings(strings)
    changed = {a: b for a, b in zip(strings, cleaned, strict=False) if a != b}
    if not changed:
        return values
    return pd.Series([changed.get(v, v) if isinstance(v, str) else v for v in values], index=values.index,
                     dtype=values.dtype, name=values.name)


#: tables up to this many cells are formatted by pandas' Styler (blank for unknown, row colours); larger ones by the
#: grid itself (Styler costs ~2 s per 100k cells on the server)
STYLER_MAX_CELLS = 40_000
HIGHLIGHT = "background-color: #fde2e1"


def _default_format(values: pd.Series) -> str | None:
    """How a column without a format of its own is shown: whole numbers with thousands separators, other floats to
    three decimals (never pandas' six), yes/no for booleans."""
    if pd.api.types.is_bool_dtype(values):
        return None
    if pd.api.types.is_float_dtype(values):
        finite = values[np.isfinite(values.to_numpy(dtype=np.float64, na_value=np.nan))]
        return "{:,.0f}" if len(finite) and bool((finite == np.round(finite)).all()) else "{:,.3f}"
    return None


def _printf(fmt: str) -> str | None:
    """A ``str.format`` number format as the grid's printf format ("{:,.3f}" -> "%,.3f"); None where it has none."""
    m = re.fullmatch(r"\{:(,?)(?:\.(\d+))?([fd])\}", fmt)
    if m is None:
        return None
    return f"%{m.group(1)}.{m.group(2)}f" if m.group(3) == "f" and m.group(2) else f"%{m.group(1)}d"


def table_data(frame: pd.DataFrame, formats: dict[str, Any] | None = None, highlight: Any = None,
               pinned: tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
    """A table as the grid shows it: redacted, every number in its format (given, or the default), unknown blank,
    booleans as yes/no, ``highlight`` rows (a boolean mask) coloured, ``pinned`` columns kept in view when the table
    scrolls sideways. Returns the data for st.dataframe and its column_config.

    The grid draws a missing cell as a grey "None" whatever a Styler says, so a column holding an unknown is shown
    as text (each value in its format, unknown empty); a column without one keeps its numbers (sorting by value)."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"ui: tables are shown from DataFrames (got {type(frame).__name__})")
    frame = redact_frame(frame).reset_index(drop=True)
    fmts: dict[str, Any] = {}
    for col in frame.columns:
        given = (formats or {}).get(col)
        fmt = given if given is not None else _default_format(frame[col])
        if fmt is not None:
            fmts[col] = fmt
        elif pd.api.types.is_bool_dtype(frame[col]):
            fmts[col] = lambda v: "yes" if v else "no"
    config: dict[str, Any] = {c: _st.column_config.Column(pinned=True) for c in pinned if c in frame.columns}
    out = frame.copy()
    for col in out.columns:
        values = out[col]
        if not values.isna().any():
            continue
        fmt = fmts.pop(col, None)
        out[col] = [("" if _unknown(v) else ("yes" if v else "no") if isinstance(v, (bool, np.bool_))
                     else str(v) if fmt is None else fmt.format(v) if isinstance(fmt, str) else fmt(v))
                    for v in values]
    if out.size <= STYLER_MAX_CELLS:
        styler = out.style.format(fmts)
        if highlight is not None:
            mask = list(pd.Series(highlight).fillna(False).astype(bool))
            styler = styler.apply(lambda row: [HIGHLIGHT if mask[row.name] else "" for _ in row], axis=1)
        return styler, config
    for col, fmt in fmts.items():
        printf = _printf(fmt) if isinstance(fmt, str) else None
        if printf is not None:
            config[col] = _st.column_config.NumberColumn(format=printf, pinned=col in pinned or None)
            continue
        out[col] = [fmt.format(v) if isinstance(fmt, str) else fmt(v) for v in out[col]]
    return out, config


def _unknown(value: Any) -> bool:
    """None, NaN, NaT or pd.NA (a scalar cell)."""
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def redact_chart(chart: Any) -> Any:
    """An Altair chart with the strings of its data (every layer's) and of its spec (labels, sort orders, titles)
    redacted, in place."""
    import altair as alt

    def walk(node: Any) -> Any:
        if isinstance(node, pd.DataFrame):
            return redact_frame(node)
        if isinstance(node, str):
            return redact_strings([node])[0]
        if isinstance(node, list):
            strings = [v for v in node if isinstance(v, str)]
            if len(strings) == len(node) and strings:
                return redact_strings(strings)
            return [walk(v) for v in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, alt.utils.schemapi.SchemaBase):
            for key, value in list(node._kwds.items()):
                if value is not alt.Undefined:
                    node._kwds[key] = walk(value)
            return node
        return node

    return walk(chart)


def redacted_csv(frame: pd.DataFrame) -> bytes:
    return redact_frame(frame).to_csv(index=False).encode()


def redacted_json(doc: str | bytes) -> bytes:
    data = doc.encode() if isinstance(doc, str) else doc
    return redact_json_bytes(data)[0]


class Download(bytes):
    """Bytes a download button may hand out: made by :func:`download` from data already redacted."""


def download(data: bytes) -> Download:
    """Mark ``data`` as redacted (it came from :func:`redacted_csv`, :func:`redacted_json` or the trace redactor)."""
    return Download(data)


# --- the door -----------------------------------------------------------------------------------------------------
#: per Streamlit function, the parameters Streamlit renders as Markdown
_MARKDOWN = {
    "markdown": ("body", "help"), "caption": ("body", "help"), "title": ("body", "help"), "header": ("body", "help"),
    "subheader": ("body", "help"), "error": ("body",), "warning": ("body",), "info": ("body",), "success": ("body",),
    "toast": ("body",), "metric": ("label", "value", "delta", "help"), "button": ("label", "help"),
    "download_button": ("label", "help"), "link_button": ("label", "help"), "toggle": ("label", "help"),
    "checkbox": ("label", "help"), "selectbox": ("label", "help"), "multiselect": ("label", "help"),
    "radio": ("label", "help", "captions"), "select_slider": ("label", "help"), "slider": ("label", "help"),
    "file_uploader": ("label", "help"), "text_input": ("label", "help"), "number_input": ("label", "help"),
    "expander": ("label",), "popover": ("label", "help"), "tabs": ("tabs",), "spinner": ("text",), "text": ("help",),
}
#: widgets whose options Streamlit renders as Markdown, and those it shows as plain text
_MARKDOWN_OPTIONS = {"radio", "select_slider"}
_PLAIN_OPTIONS = {"selectbox", "multiselect"}
#: functions that lay things out (their result is a container: wrapped in turn)
_CONTAINERS = {"container", "expander", "popover", "empty", "form", "columns", "tabs"}
#: functions with nothing a trace could write in them
_PASS = {"session_state", "stop", "rerun", "cache_resource", "cache_data", "Page", "navigation", "switch_page",
         "set_page_config", "column_config", "query_params", "divider", "fragment", "context", "progress"}


def _markdown_arg(value: Any) -> Any:
    if value is None or isinstance(value, (Md, int, float)) or isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return [_markdown_arg(v) for v in value]
    return text(value)


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


class _Door:
    """Streamlit (the module, the sidebar, a column, a container) with its Markdown parameters escaped."""

    def __init__(self, target: Any) -> None:
        self._target = target

    if TYPE_CHECKING:  # for the type checker only: __getattr__ passes both through, and both end the script run

        def stop(self) -> NoReturn: ...

        def rerun(self, scope: Any = ...) -> NoReturn: ...

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_target")
        if name in _PASS:
            return getattr(target, name)
        if name == "sidebar":
            return _Door(target.sidebar)
        fn = getattr(target, name, None)
        if fn is None or not (name in _MARKDOWN or name in _CONTAINERS or name in _TABLES or name in _CHARTS
                              or name in ("json", "code")):
            raise AttributeError(f"ui: st.{name} is not allowed here (trace text would reach it unescaped); "
                                 "add it to kinetoscope/app/ui.py with the parameters Streamlit renders as Markdown")

        def call(*args: Any, **kwargs: Any) -> Any:
            extra: dict[str, Any] = {
                k: kwargs.pop(k) for k in ("formats", "highlight", "pinned") if k in kwargs and name in _TABLES
            }
            if name in _CHARTS:
                if not kwargs.get("description"):
                    raise TypeError("ui: every chart says what it shows in words (description=...): its text "
                                    "alternative")
                extra["description"] = kwargs.pop("description")
            bound = _signature(fn).bind_partial(*args, **kwargs)
            params = bound.arguments
            for key in _MARKDOWN.get(name, ()):
                if key in params:
                    params[key] = _markdown_arg(params[key])
            if name in _MARKDOWN_OPTIONS or name in _PLAIN_OPTIONS:
                shown = params.get("format_func") or str
                wrap = text if name in _MARKDOWN_OPTIONS else plain
                params["format_func"] = lambda option: wrap(shown(option))
            if name in _TABLES:
                data, config = table_data(params["data"], extra.pop("formats", None), extra.pop("highlight", None),
                                          tuple(extra.pop("pinned", ())))
                params["data"] = data
                if config:
                    params["column_config"] = {**config, **(params.get("column_config") or {})}
                params.setdefault("hide_index", True)
            if name in _CHARTS:
                chart = redact_chart(params["altair_chart"]).properties(description=plain(extra["description"]))
                params["altair_chart"] = chart.configure_axis(labelColor=CHART_TEXT, titleColor=CHART_TEXT) \
                    .configure_legend(labelColor=CHART_TEXT, titleColor=CHART_TEXT, labelLimit=0)
            if name == "json":
                params["body"] = redact(params["body"])
            if name == "code":
                params["body"] = redact_strings([params["body"]])[0]
            if name == "download_button" and not isinstance(params.get("data"), Download):
                raise TypeError("ui: a download hands out redacted data only (ui.download(...))")
            result = fn(*bound.args, **bound.kwargs)
            if name in _CONTAINERS:
                return [_Door(r) for r in result] if isinstance(result, (list, tuple)) else _Door(result)
            return result

        return call

    def __enter__(self) -> _Door:
        object.__getattribute__(self, "_target").__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return object.__getattribute__(self, "_target").__exit__(*exc)


_TABLES = {"dataframe"}
_CHARTS = {"altair_chart"}

#: what the screens call ``st``
st = _Door(_st)


def components_html(html: str, height: int) -> None:
    """An iframe of the app's own HTML (the Perfetto launcher): whatever it shows from a trace it escapes itself."""
    import streamlit.components.v1 as components

    components.html(html, height=height)


#: the app's CSS. Long words wrap instead of widening the page; a metric's label and value wrap instead of being cut
#: to an ellipsis (a headline number read "174.…" at 1024 px); keyboard focus is always visible; secondary text
#: (captions, chart axes) at a contrast of at least 4.5:1 on white (Streamlit's captions were ~3.9:1)
PAGE_CSS = """<style>
[data-testid=stMarkdownContainer], [data-testid=stCaptionContainer] { overflow-wrap: anywhere; }
[data-testid=stMetricValue], [data-testid=stMetricValue] *, [data-testid=stMetricLabel], [data-testid=stMetricLabel] * {
  white-space: normal !important; overflow: visible !important; text-overflow: clip !important; }
[data-testid=stMetricValue] { font-size: 1.75rem !important; line-height: 1.2 !important; }
[data-testid=stCaptionContainer], [data-testid=stCaptionContainer] * { color: #555a66 !important; }
:focus-visible { outline: 3px solid #1f5fbf !important; outline-offset: 2px !important; }
</style>"""
#: chart text colour (axis labels and titles, legends) at >= 4.5:1 on white
CHART_TEXT = "#4a4f5c"


def page_style() -> None:
    """The app's CSS, once per page."""
    _st.html(PAGE_CSS)


def unescaped(shown: str) -> str:
    """Markdown from :func:`escape` back to its characters (tests read what a page says through this)."""
    return re.sub(r"\\(.)", r"\1", shown).replace("\u200b", "")

