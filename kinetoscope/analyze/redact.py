"""Redact secret-looking values (tokens, keys, passwords) from trace metadata before showing or exporting it."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
#: a secret-ish word as a whole segment of the key: HF_TOKEN, db.password, apiKey (not TOKENIZERS_PARALLELISM)
_SECRET_KEY = re.compile(
    r"(^|[_\-.])(tokens?|secrets?|passw(or)?d|pwd|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|auth|cookie)([_\-.]|$)"
    r"|^aws_|[_\-.]key$|^key$",
    re.IGNORECASE,
)
_CAMEL_SECRET = re.compile(r"[a-z](Token|Secret|Password|ApiKey|Key)$")
#: values that look like credentials wherever they appear
_SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})$"
)
_ASSIGNMENT = re.compile(r"\b([A-Za-z_]*(TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY)[A-Za-z_]*)=(\S+)", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key) or _CAMEL_SECRET.search(key))


def redact(value: Any, key: str = "") -> Any:
    """A copy of ``value`` with secret-looking entries replaced by ``[redacted]``."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_key(str(k)) and not isinstance(v, (dict, list)) else redact(v, str(k)))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        if _SECRET_VALUE.match(value.strip()):
            return REDACTED
        return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", value)
    return value


def redacted_trace(data: bytes) -> bytes:
    """A trace's JSON with its top-level metadata redacted; ``traceEvents`` passes through untouched."""
    import msgspec

    try:
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return data  # a bare array or not a JSON object: it carries no metadata block
    out: dict[str, Any] = {}
    for key, raw in top.items():
        if key == "traceEvents":
            out[key] = raw
            continue
        value = msgspec.json.decode(raw)
        out[key] = REDACTED if is_secret_key(key) and not isinstance(value, (dict, list)) else redact(value, key)
    return msgspec.json.encode(out)
