"""Redact secrets from a trace before it is shown, exported or attached to a public bug report.

Every string of the file is checked - top-level metadata and every event's arguments alike - for
the shapes of known credentials, with detect-secrets' detectors (AWS, Azure, GitHub, GitLab, Stripe,
Slack, SendGrid, PyPI, npm, Discord, Twilio, ... tokens, JWTs, private keys) and the few shapes it does
not know (Hugging Face ``hf_`` and GitHub ``github_pat_`` tokens, ``sk-`` API keys, ``Bearer``/``Basic``
credentials, credentials in URLs), plus ``key=value`` / ``key: value`` / ``--key value`` pairs, JSON
members and argument lists whose key names a secret (``HF_TOKEN``, ``db_password``, ``apiKey``,
``["--password", "..."]``). Only the secret itself is replaced by ``[redacted]``; everything else, byte
for byte and in place, stays as it was, so the redacted trace analyses exactly like the original.

It works on the JSON text: a secret can only sit inside a JSON string. A fast search for hints (``://``,
``token``, ``hf_``, ``eyJ``, a JSON escape, ...; each detector's own prefix) finds the few strings worth
a closer look without decoding the document; those are decoded (escapes included) and checked whole.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Generator, Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

REDACTED = "[redacted]"

#: a name whose last segment is a secret-ish word: HF_TOKEN, db.password, api-key, AWS_SECRET_ACCESS_KEY
#: (not max_tokens, token_budget, TOKENIZERS_PARALLELISM, AWS_REGION)
_SECRET_KEY = re.compile(
    r"(^|[_\-.])(token|secrets?|passw(or)?d|passphrase|pwd|api[_-]?key|access[_-]?key|private[_-]?key|credentials?"
    r"|auth|authorization|cookie|account[_-]?key|sas|key)$",
    re.IGNORECASE,
)
_CAMEL_SECRET = re.compile(r"[a-z](Token|Secret|Password|ApiKey|AccountKey|Key)$")

#: token shapes detect-secrets does not know (checked in every string, wherever they appear in it)
_TOKEN_SHAPES = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{30,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\bAKIA[0-9A-Z]{16}\b|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
#: "Bearer <token>" / "Basic <credentials>" / "token <token>", any case; the credential must look like one
_AUTH_HEADER = re.compile(r"\b(bearer|basic|token)\s+([A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE)
#: credentials in a URL: scheme://user:password@host (the user may be empty, the password may hold '@')
_URL_CREDENTIALS = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/\s@]*:([^\s/]*)@[^@/\s]")
#: a PEM private key: its body goes, whatever its type
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(.*?)(-----END [A-Z0-9 ]*PRIVATE KEY"
                          r"( BLOCK)?-----|$)", re.DOTALL)
_VALUE = r"(\"[^\"]*\"|'[^']*'|[^\s;&,\"'\]\[}{]+)"
#: NAME=value (not ==, <=, >=, !=, ~=: a version pin), found even inside another assignment's value
_EQUALS = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z][A-Za-z0-9_.-]*)\s*(?<![=<>!~])=(?!=)\s*" + _VALUE)
#: NAME: value
_COLON = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z][A-Za-z0-9_.-]*)\s*:(?!//)\s*" + _VALUE)
#: --name value / -name value on a command line
_FLAG = re.compile(r"(?:^|(?<=\s))--?([A-Za-z][A-Za-z0-9_.-]*)\s+(?!-)" + _VALUE)
#: a command-line flag naming a secret, alone in a string (an argv list: its value is the next item)
_SECRET_FLAG = re.compile(r"^--?([A-Za-z][A-Za-z0-9_.-]*)$")

_DETECTORS = ("AWSKeyDetector", "AzureStorageKeyDetector", "BasicAuthDetector", "GitHubTokenDetector",
              "GitLabTokenDetector", "JwtTokenDetector", "OpenAIDetector", "SlackDetector", "PrivateKeyDetector",
              "StripeDetector", "TwilioKeyDetector", "DiscordBotTokenDetector", "SendGridDetector", "MailchimpDetector",
              "NpmDetector", "PypiTokenDetector", "SquareOAuthDetector")

#: where to look closer, found in the lower-cased text with plain substring search (each at memchr speed):
#: the words a secret sits beside, and JSON escapes (which could hide anything)
_HINT_WORDS = (b"://", b"token", b"secret", b"pass", b"pwd", b"key", b"auth", b"credential", b"cookie", b"sas",
               b"bearer", b"basic", b"-----begin", b"\\u", b"\\/")
#: ... and runs of token characters long enough to be a credential, kept when one of these shapes is in them
#: (the hand-written ones and every detector's own: AWS, GitHub, GitLab, Stripe, Slack, JWT, OpenAI, SendGrid,
#: npm, PyPI, Square, Twilio, Discord, Mailchimp)
_RUN_MIN = 20
_RUN_SHAPES = re.compile(
    rb"hf_|github_pat_|gh[pousr]_|sk-|[rs]k_(live|test)_|A[KS]IA|xox[abposr]-|eyJ|gl(pat|dt|rt|ptt|cbt|soat|imt|ft"
    rb"|agent|oas)-|GR1348941|SG\.|npm_|pypi-|sq0[a-z]{3}-|EAAA|(AC|SK)[a-z0-9]{32}|[MNO][A-Za-z\d_-]{23,25}\."
    rb"|[0-9a-f]{32}-us[0-9]"
)
_TOKEN_CHAR = np.zeros(256, dtype=bool)
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.+/=":
    _TOKEN_CHAR[_c] = True
_RUN_CHUNK = 16 * 2**20
#: detect-secrets keeps its settings (which detectors run) in one process-wide object, and ``transient_settings``
#: swaps them in and back out: two threads scanning at once (the app's sessions, a threaded Dask worker) would run
#: with each other's - or the default - detectors and redact differently. Its use is serialised here; this lock
#: is the library's only process state, and it guards a third party's.
_DETECT_SECRETS = threading.Lock()


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key) or _CAMEL_SECRET.search(key))


def _looks_like_credential(text: str) -> bool:
    """Letters and digits mixed, or long: 'eyJ0eX...', 'dXNlcjpwYXNz' - not 'embedding' or 'operations'."""
    has_digit = any(c.isdigit() for c in text)
    has_alpha = any(c.isalpha() for c in text)
    return (has_digit and has_alpha) or len(text) >= 24


def _detect_secrets_values(text: str) -> list[str]:
    """What detect-secrets' detectors find in ``text`` (its secret values), or nothing when not installed."""
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.core.scan import scan_line
        from detect_secrets.settings import transient_settings
    except ImportError:  # pragma: no cover - a core dependency; the hand-written shapes still apply
        return []
    detectors: dict[str, type] = get_mapping_from_secret_type_to_class()
    available = {cls.__name__ for cls in detectors.values()}
    plugins = [{"name": name} for name in _DETECTORS if name in available]
    values: list[str] = []
    with _DETECT_SECRETS, transient_settings({"plugins_used": plugins}):
        for line in text.splitlines() or [text]:
            values.extend(s.secret_value for s in scan_line(line) if s.secret_value and len(s.secret_value) >= 4)
    return values


def load_detectors() -> None:
    """Import and set up detect-secrets' detectors now. For a process that redacts what it writes as it exits (the
    capture's sidecars, from atexit): importing them then would define classes through ``exec``, which in CPython
    (3.11) clears the note that the process is ending on an unhandled Ctrl-C - it would exit 1, not by SIGINT."""
    _detect_secrets_values("")


def _value_span(m: re.Match[str], group: int) -> tuple[int, int]:
    """The span of a matched value, quotes left out."""
    start, end = m.span(group)
    if end - start >= 2 and m.group(group)[0] in "\"'" and m.group(group)[-1] == m.group(group)[0]:
        return start + 1, end - 1
    return start, end


def _secret_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = [m.span() for m in _TOKEN_SHAPES.finditer(text)]
    spans += [m.span(2) for m in _AUTH_HEADER.finditer(text) if _looks_like_credential(m.group(2))]
    spans += [m.span(1) for m in _URL_CREDENTIALS.finditer(text) if m.group(1)]
    spans += [m.span(2) for m in _PRIVATE_KEY.finditer(text) if m.group(2).strip()]
    for pattern in (_EQUALS, _COLON, _FLAG):
        pos = 0
        while True:  # matches may overlap ('env: HF_TOKEN=...'): each start position is tried
            m = pattern.search(text, pos)
            if m is None:
                break
            value = m.group(2).strip("\"'")
            if is_secret_key(m.group(1)) and value and value.lower() not in ("bearer", "basic", "token"):
                spans.append(_value_span(m, 2))
            pos = m.start() + 1
    for secret in set(_detect_secrets_values(text)):
        if "PRIVATE KEY" in secret:  # the PEM marker: its body is handled above
            continue
        start = text.find(secret)
        while start >= 0:
            # a detector may report only a token's prefix ('glpat'): the whole run of token characters goes
            lo, hi = start, start + len(secret)
            while lo > 0 and text[lo - 1] in _TOKEN_TEXT_CHARS:
                lo -= 1
            while hi < len(text) and text[hi] in _TOKEN_TEXT_CHARS:
                hi += 1
            spans.append((lo, hi))
            start = text.find(secret, start + 1)
    return spans


_TOKEN_TEXT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.+/=")


def redact_text(text: str) -> str:
    """``text`` with every secret found in it replaced by ``[redacted]`` (the rest kept)."""
    spans = sorted(s for s in _secret_spans(text) if s[1] > s[0])
    if not spans:
        return text
    out: list[str] = []
    last = 0
    cur_s, cur_e = spans[0]
    for s, e in spans[1:] + [(len(text) + 1, len(text) + 1)]:
        if s <= cur_e:  # overlapping or touching: one redaction
            cur_e = max(cur_e, e)
            continue
        out.append(text[last:cur_s])
        out.append(REDACTED)
        last = cur_e
        cur_s, cur_e = s, e
    out.append(text[last:])
    return "".join(out)


def _is_secret_flag(text: str) -> bool:
    m = _SECRET_FLAG.match(text)
    return m is not None and is_secret_key(m.group(1))


def redact(value: Any, key: str = "") -> Any:
    """A copy of a decoded JSON value with secrets redacted (for metadata shown in the app): strings checked
    whole, every string under a key naming a secret replaced, and in a list the item after a secret flag."""
    if isinstance(value, dict):
        return {k: (_redact_all(v) if is_secret_key(str(k)) else redact(v, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        out = []
        after_flag = False
        for item in value:
            out.append(REDACTED if after_flag and isinstance(item, str) and item else redact(item, key))
            after_flag = isinstance(item, str) and _is_secret_flag(item)
        return out
    if isinstance(value, str):
        return redact_text(value)
    return value


def _redact_all(value: Any) -> Any:
    """Under a key naming a secret: every non-empty string goes (in lists and objects too)."""
    if isinstance(value, str):
        return REDACTED if value else value
    if isinstance(value, list):
        return [_redact_all(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact_all(v) for k, v in value.items()}
    return value


# --- the JSON text ----------------------------------------------------------------------------------
def _string_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """The JSON string literal holding byte ``pos`` ([start quote, end quote]). Outside strings JSON has only
    numbers, literals and punctuation, so a hint found at ``pos`` is inside one: the nearest unescaped
    quotes around it bound it."""
    start = pos + 1
    while True:
        start = data.rfind(b'"', 0, start)
        if start < 0:
            return None
        if _unescaped(data, start):
            break
    end = max(pos, start + 1)
    while True:
        end = data.find(b'"', end)
        if end < 0:
            return None
        if _unescaped(data, end):
            return start, end
        end += 1


def _unescaped(data: bytes, quote: int) -> bool:
    n = 0
    i = quote - 1
    while i >= 0 and data[i] == 0x5C:  # backslash
        n += 1
        i -= 1
    return n % 2 == 0


def _hint_positions(data: bytes) -> list[int]:
    lower = data.lower()
    found: list[int] = []
    for word in _HINT_WORDS:
        i = lower.find(word)
        while i >= 0:
            found.append(i)
            i = lower.find(word, i + 1)
    del lower
    found.extend(_token_runs(data))
    return sorted(set(found))


def _token_runs(data: bytes) -> Iterator[int]:
    """Starts of runs of token characters (at least _RUN_MIN long) holding a token shape, chunk by chunk."""
    seen: dict[bytes, bool] = {}
    n = len(data)
    lo = 0
    while lo < n:
        hi = min(n, lo + _RUN_CHUNK)
        while hi < n and _TOKEN_CHAR[data[hi]]:  # end the chunk between runs
            hi += 1
        mask = _TOKEN_CHAR[np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo)].view(np.int8)
        edges = np.diff(mask, prepend=np.int8(0), append=np.int8(0))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        del mask, edges
        long = (ends - starts) >= _RUN_MIN
        for s, e in zip(starts[long].tolist(), ends[long].tolist(), strict=False):
            run = data[lo + s:lo + e]
            hit = seen.get(run)
            if hit is None:
                hit = seen[run] = _RUN_SHAPES.search(run) is not None
            if hit:
                yield lo + s
        lo = hi  # the next chunk starts where this one ended, never inside a run


_AFTER_KEY = re.compile(rb'\s*:\s*')
_NEXT_ITEM = re.compile(rb'\s*,\s*"')


def _decode(data: bytes, start: int, end: int) -> str | None:
    try:
        text = json.loads(data[start:end + 1])
    except ValueError:
        return None
    return text if isinstance(text, str) else None


def _literals(data: bytes) -> Iterator[tuple[int, int, bool]]:
    """(start, end, redact whole) of each string literal worth checking, in order, once each."""
    seen_end = -1
    for pos in _hint_positions(data):
        if pos <= seen_end:
            continue
        span = _string_at(data, pos)
        if span is None:
            continue
        start, end = span
        if start <= seen_end:
            continue
        seen_end = end
        yield start, end, False
        text = _decode(data, start, end)
        if text is None:
            continue
        after = _AFTER_KEY.match(data, end + 1)
        if after is not None and is_secret_key(text):
            # a member whose key names a secret: its string value, or every string of its list, goes
            seen_end = yield from _whole_value(data, after.end(), seen_end)
            continue
        if _is_secret_flag(text):  # an argv list: ["--password", "hunter2"]
            item = _NEXT_ITEM.match(data, end + 1)
            if item is not None:
                value = _string_at(data, item.end())
                if value is not None and value[0] == item.end() - 1:
                    seen_end = value[1]
                    yield value[0], value[1], True


_ITEM_GAP = re.compile(rb"\s*(,\s*)?")


def _whole_value(data: bytes, at: int, seen_end: int) -> Generator[tuple[int, int, bool], None, int]:
    """The string literals of the value starting at ``at``: one string, or the strings of a flat list.
    Returns the end of the last one (or ``seen_end``)."""
    if data[at:at + 1] == b'"':
        value = _string_at(data, at + 1)
        if value is not None and value[0] == at:
            yield value[0], value[1], True
            return value[1]
    elif data[at:at + 1] == b"[":
        pos = at + 1
        while True:
            pos = _ITEM_GAP.match(data, pos).end()  # type: ignore[union-attr]
            if data[pos:pos + 1] != b'"':
                break
            value = _string_at(data, pos + 1)
            if value is None or value[0] != pos:
                break
            yield value[0], value[1], True
            seen_end = value[1]
            pos = value[1] + 1
    return seen_end


def _redacted_parts(data: bytes, counter: list[int]) -> Iterator[bytes | memoryview]:
    """The JSON text with every secret in its strings redacted, as consecutive pieces (views of ``data`` between
    the redactions: nothing is copied whole); ``counter[0]`` counts the strings changed."""
    view = memoryview(data)
    last = 0
    done: dict[tuple[bytes, bool], bytes | None] = {}  # the same literal (a repeated name) is checked once
    for start, end, whole in _literals(data):
        raw = data[start:end + 1]
        if (raw, whole) in done:
            new_raw = done[(raw, whole)]
        else:
            text = _decode(data, start, end)
            new = None if not text else REDACTED if whole else redact_text(text)
            new_raw = done[(raw, whole)] = (None if new is None or new == text
                                            else json.dumps(new, ensure_ascii=False).encode())
        if new_raw is None:
            continue
        yield view[last:start]
        yield new_raw
        last = end + 1
        counter[0] += 1
    yield view[last:]


def redact_json_bytes(data: bytes) -> tuple[bytes, int]:
    """(the JSON text with every secret in its strings redacted, how many strings changed). Everything else is
    kept byte for byte: the result decodes - and analyses - exactly as the original did."""
    counter = [0]
    parts = list(_redacted_parts(data, counter))
    if not counter[0]:
        return data, 0
    return b"".join(parts), counter[0]


def redacted_gzip(data: bytes, level: int = 1) -> bytes:
    """The redacted trace (as :func:`redacted_trace`), gzipped as it is produced: the redacted JSON is never held
    whole beside the original (a 357 MB trace is compressed piece by piece into what it gzips to). ISA-L's deflate
    where installed (~10x zlib's speed at level 1)."""
    zlib_module: ModuleType
    try:
        from isal import isal_zlib as zlib_module
    except ImportError:  # pragma: no cover - platforms without ISA-L wheels
        import zlib as zlib_module
    comp = zlib_module.compressobj(level, zlib_module.DEFLATED, 16 + zlib_module.MAX_WBITS)
    out = [comp.compress(part) for part in _redacted_parts(data, [0])]
    out.append(comp.flush())
    return b"".join(out)


def redacted_trace(data: bytes) -> bytes:
    """A trace's JSON with every secret redacted, in the metadata and in every event's arguments."""
    return redact_json_bytes(data)[0]


def redact_strings(values: Iterable[str]) -> list[str]:
    """Each string with its secrets redacted, exactly as it would be inside a trace (for what the app shows: table
    cells, chart labels, titles). The strings go through the same JSON-text pass as a trace, each in a list of its
    own (an argv flag in one string never reaches into the next), so the fast search for hints decides which few
    are checked closely."""
    values = list(values)
    if not values:
        return values
    data = json.dumps([[v] for v in values], ensure_ascii=False).encode()
    cleaned, changed = redact_json_bytes(data)
    if not changed:
        return values
    return [v[0] for v in json.loads(cleaned)]
