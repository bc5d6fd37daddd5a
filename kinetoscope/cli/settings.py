"""The settings a user gives through the environment, read here and at the app's entry only, and passed down to the
library as arguments (the library reads no environment variable):

* ``KINETOSCOPE_THREADS``: how many threads a large rank's analyzers share (``build_report(max_threads=...)``);
* ``KINETOSCOPE_DECODER=reference``: the reference decoder for every file, not the compiled scanner
  (``LoadLimits.decoder``);
* ``KINETOSCOPE_CACHE_DIR``: where ``analyze`` keeps parsed traces (set: the cache is on, as with ``--cache``);
  ``--cache`` alone keeps them in ``$XDG_CACHE_HOME/kinetoscope`` (``~/.cache/kinetoscope``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.errors import ConfigError

DECODERS = ("native", "reference")


@dataclass(frozen=True)
class Settings:
    #: threads a large rank's analyzers share; None: the library's choice (up to 4, by the cores)
    threads: int | None = None
    #: "native" (the compiled scanner where built) or "reference" (the Python decoder for everything)
    decoder: str = "native"
    #: the parsed-trace cache the environment asks for; None: only where ``--cache`` asks
    cache_dir: Path | None = None


def threads_setting(text: str) -> int | None:
    """``KINETOSCOPE_THREADS``'s value as a thread count (empty: None); a clear error for anything else."""
    chosen = text.strip()
    if not chosen:
        return None
    if not chosen.isdigit() or not 1 <= int(chosen) <= 64:
        raise ConfigError(f"KINETOSCOPE_THREADS={chosen!r}: expected a whole number of threads from 1 to 64")
    return int(chosen)


def from_environment(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in ``environ`` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    decoder = env.get("KINETOSCOPE_DECODER", "").strip() or "native"
    if decoder not in DECODERS:
        raise ConfigError(f"KINETOSCOPE_DECODER={decoder!r}: expected 'reference' (or unset: the compiled scanner)")
    cache = env.get("KINETOSCOPE_CACHE_DIR")
    return Settings(threads=threads_setting(env.get("KINETOSCOPE_THREADS", "")), decoder=decoder,
                    cache_dir=Path(cache) if cache else None)


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``--cache`` keeps parsed traces: ``KINETOSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kinetoscope``, else
    ``~/.cache/kinetoscope``."""
    env = os.environ if environ is None else environ
    if env.get("KINETOSCOPE_CACHE_DIR"):
        return Path(env["KINETOSCOPE_CACHE_DIR"])
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kinetoscope"
