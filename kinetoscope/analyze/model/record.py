"""Typed results: the ``Record`` base every analyzer's result record, and the report's own records, derive from.

A record is a frozen msgspec Struct whose fields are its JSON object's keys, in the order the report writes them;
``to_dict`` gives that object (nested records become objects, tuples become lists). A field left ``UNSET`` is a
key the object leaves out (a key present only in some cases); ``None`` is written as ``null``. Units are in the
field names (``_us``, ``_bytes``), as in the report.

The JSON the records give is the report's contract (``docs/report.md``): it must stay byte-identical to what the
report wrote before it was typed (``scripts/report_guard.py``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["UNSET", "Record", "UnsetType", "json_ready"]

R = TypeVar("R", bound="Record")


def json_ready(value: Any) -> Any:
    """A record, or a list, tuple or dict holding records, as plain JSON-ready objects (other values unchanged)."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    return value


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """A typed JSON object: its fields are the keys, in order."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not UNSET:
                out[name] = json_ready(value)
        return out
