"""Redact secrets from a trace before it is shown, exported or attached to a public bug report.

Every string of the file is checked - top-level metadata and every event's arguments alike - for
the shapes of known credentials, with detect-secrets' detectors (AWS and Azure keys, JWTs, Slack,
GitHub, Stripe, ... tokens, private keys, credentials in URLs) and the few shapes it does not know
(Hugging Face ``hf_`` and GitHub ``github_pat_`` tokens, ``sk-`` API keys, ``Bearer`` tokens), plus
``key=value`` / ``--key value`` pairs and JSON members whose key names a secret (``HF_TOKEN``,
``db_password``, ``apiKey``). Only the secret itself is replaced by ``[redacted]``; everything else,
byte for byte and in place, stays as it was, so the redacted trace analyses exactly like the original.

It works on the JSON text: a secret can only sit inside a JSON string, and a cheap scan for hints
(``://``, ``token``, ``hf_``, ``eyJ``, ...) finds the few strings worth a closer look without
decoding the document.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

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
#: "Bearer <token>" / "Basic <credentials>" in headers
_AUTH_HEADER = re.compile(r"\b(Bearer|Basic|Token)\s+([A-Za-z0-9._~+/=-]{8,})")
#: credentials in a URL: scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/\s@]+:)([^@\s/]+)(@)")
#: NAME=value, NAME: value, --name=value, and the command-line form --name value, where NAME names a secret
_ASSIGNMENT = re.compile(
    r"((?:--?)?([A-Za-z][A-Za-z0-9_.-]*)\s*[=:]\s*|(?:^|\s)--?([A-Za-z][A-Za-z0-9_.-]*)\s+)"
    r"(\"[^\"]*\"|'[^']*'|[^\s;&,\"']+)"
)
#: cheap hints: a string without any of these holds no secret we would find (checked on the raw JSON)
_HINTS = re.compile(
    rb"://|hf_|gh[pousr]_|github_pat|sk-|AKIA|ASIA|xox[abposr]-|eyJ|[Bb]earer|[Bb]asic |-----BEGIN|"
    rb"(?i:token|secret|passw|pwd|api[_-]?key|access[_-]?key|account[_-]?key|private|credential|auth|cookie|sas)"
)

_DETECTORS = ("AWSKeyDetector", "AzureStorageKeyDetector", "BasicAuthDetector", "GitHubTokenDetector",
              "GitLabTokenDetector", "JwtTokenDetector", "OpenAIDetector", "SlackDetector", "PrivateKeyDetector",
              "StripeDetector", "TwilioKeyDetector", "DiscordBotTokenDetector", "SendGridDetector", "MailchimpDetector",
              "NpmDetector", "PypiTokenDetector", "SquareOAuthDetector", "TelegramBotTokenDetector")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key) or _CAMEL_SECRET.search(key))


def _detect_secrets_values(text: str) -> list[str]:
    """What detect-secrets' detectors find in ``text`` (its secret values), or nothing when not installed."""
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.core.scan import scan_line
        from detect_secrets.settings import transient_settings
    except ImportError:  # pragma: no cover - a core dependency; the hand-written shapes still apply
        return []
    available = {c.__name__ for c in get_mapping_from_secret_type_to_class().values()}
    plugins = [{"name": name} for name in _DETECTORS if name in available]
    with transient_settings({"plugins_used": plugins}):
        return [s.secret_value for s in scan_line(text) if s.secret_value and len(s.secret_value) >= 4]


def redact_text(text: str) -> str:
    """``text`` with every secret found in it replaced by ``[redacted]`` (the rest kept)."""
    if not _HINTS.search(text.encode("utf-8", "surrogatepass")):
        return text
    out = _TOKEN_SHAPES.sub(REDACTED, text)
    out = _AUTH_HEADER.sub(lambda m: f"{m.group(1)} {REDACTED}", out)
    out = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", out)
    out = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}{REDACTED}" if is_secret_key(m.group(2) or m.group(3)) and
                          m.group(4) not in (REDACTED, "Bearer", "Basic", "Token") else m.group(0), out)
    for secret in sorted(set(_detect_secrets_values(out)), key=len, reverse=True):
        if secret in out and secret != REDACTED and REDACTED not in secret:
            out = out.replace(secret, REDACTED)
    return out


def redact(value: Any, key: str = "") -> Any:
    """A copy of a decoded JSON value with secrets redacted (for metadata shown in the app)."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_key(str(k)) and not isinstance(v, (dict, list)) and v not in (None, "")
                    else redact(v, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


# --- the JSON text ----------------------------------------------------------------------------------
def _string_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """The JSON string literal holding byte ``pos`` ([start quote, end quote]). Outside strings JSON has only
    numbers, literals and punctuation, so a hint found at ``pos`` is inside one: the nearest unescaped
    quotes around it bound it."""
    start = pos
    while True:
        start = data.rfind(b'"', 0, start)
        if start < 0:
            return None
        if _unescaped(data, start):
            break
    end = pos
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


_AFTER_KEY = re.compile(rb'\s*:\s*"')


def _literals(data: bytes) -> Iterator[tuple[int, int, bool]]:
    """(start, end, is_secret_member_value) of each string literal worth checking, in order, once each."""
    seen_end = -1
    for m in _HINTS.finditer(data):
        if m.start() <= seen_end:
            continue
        span = _string_at(data, m.start())
        if span is None:
            continue
        start, end = span
        seen_end = end
        yield start, end, False
        # a member whose key names a secret: its string value goes whatever it looks like
        after = _AFTER_KEY.match(data, end + 1)
        if after is not None:
            try:
                key = json.loads(data[start:end + 1])
            except ValueError:
                continue
            if isinstance(key, str) and is_secret_key(key):
                value = _string_at(data, after.end())
                if value is not None and value[0] == after.end() - 1:
                    seen_end = value[1]
                    yield value[0], value[1], True


def redact_json_bytes(data: bytes) -> tuple[bytes, int]:
    """(the JSON text with every secret in its strings redacted, how many strings changed). Everything else is
    kept byte for byte: the result decodes - and analyses - exactly as the original did."""
    parts: list[bytes] = []
    last = 0
    changed = 0
    for start, end, whole in _literals(data):
        raw = data[start:end + 1]
        try:
            text = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(text, str):
            continue
        new = REDACTED if whole and text else redact_text(text)
        if new == text:
            continue
        parts.append(data[last:start])
        parts.append(json.dumps(new, ensure_ascii=False).encode())
        last = end + 1
        changed += 1
    if not changed:
        return data, 0
    parts.append(data[last:])
    return b"".join(parts), changed


def redacted_trace(data: bytes) -> bytes:
    """A trace's JSON with every secret redacted, in the metadata and in every event's arguments."""
    return redact_json_bytes(data)[0]
