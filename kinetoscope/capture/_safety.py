"""Capture must never harm the training job: every fault is logged once and absorbed."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("kinetoscope.capture")
_said: set[str] = set()

F = TypeVar("F", bound=Callable[..., Any])


def warn_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        log.warning("kinetoscope: %s", message)


def never_raises(key: str, default: Any = None) -> Callable[[F], F]:
    """Decorator: log the first failure under ``key`` and return ``default`` instead of raising."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the training job comes first
                warn_once(key, f"{key} failed and was disabled ({type(exc).__name__}: {exc}); training continues")
                return default

        return inner  # type: ignore[return-value]

    return wrap
