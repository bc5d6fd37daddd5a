"""``kinetoscope redact``: a copy of a trace, or of a capture directory, with its secrets redacted."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kinetoscope.cli.output import EXIT_OK
from kinetoscope.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    redact = sub.add_parser(
        "redact",
        help="write a copy of a trace, or of a capture directory, with its secrets redacted (for a public bug report)",
        description=(
            "Write TRACE to OUT with every secret-looking value replaced by [redacted]: tokens (Hugging Face, "
            "GitHub, OpenAI-style, AWS, Slack, JWTs, ...), credentials in URLs, Azure account keys, and values "
            "of keys or flags that name a secret (HF_TOKEN=..., --password ...), in the metadata and in every "
            "event's arguments. Everything else is kept byte for byte, so OUT analyses like TRACE. OUT ending "
            "in .gz is gzipped. TRACE may be a capture directory: then OUT is a new directory holding every "
            "trace and sidecar (manifest, steps.json) of it, each redacted, under the same names (hidden "
            "temporaries and other files are left out, and counted); nothing is written unless all of them "
            "read as traces or JSON."
        ),
    )
    redact.add_argument("trace", metavar="TRACE")
    redact.add_argument("-o", "--output", required=True, metavar="OUT")
    redact.add_argument("--max-size", default="8G", help="refuse traces larger than this once gunzipped (default 8G)")
    redact.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    redact.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    import gzip
    from pathlib import Path

    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.analyze.ingest.loader import load_trace, read_bytes
    from kinetoscope.analyze.ingest.redact import redact_json_bytes
    from kinetoscope.errors import TraceSourceError
    from kinetoscope.fsutil import atomic_write

    source, target = Path(args.trace), Path(args.output)
    from kinetoscope.cli.settings import from_environment

    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size), decoder=from_environment().decoder)
    if source.is_dir():
        return _redact_directory(source, target, limits)
    if not source.is_file():
        raise TraceSourceError(f"{source}: no such file or directory")
    if target.resolve() == source.resolve():
        raise ConfigError("OUT must differ from TRACE (the original is kept)")
    load_trace(source, limits)  # what is not a trace is refused here, as by analyze (and nothing is written)
    data = read_bytes(source, limits)
    cleaned, changed = redact_json_bytes(data)
    del data
    atomic_write(target, gzip.compress(cleaned, compresslevel=6) if target.name.endswith(".gz") else cleaned)
    print(f"{target}: {changed} string{'s' if changed != 1 else ''} redacted", file=sys.stderr)
    return EXIT_OK


def _redact_directory(source: Any, target: Any, limits: Any) -> int:
    """``kinetoscope redact DIR -o OUT``: every trace and sidecar under DIR, redacted, into the new directory OUT
    (same relative names). Everything is read and checked first (traces as ``analyze`` reads them, sidecars as
    JSON); OUT is written as a temporary directory renamed into place, so a failure leaves nothing behind."""
    import gzip
    import shutil
    import tempfile
    from pathlib import Path

    import msgspec

    from kinetoscope.analyze.ingest.jobs import SIDECAR_SUFFIXES, TRACE_SUFFIXES
    from kinetoscope.analyze.ingest.loader import load_trace, read_bytes
    from kinetoscope.analyze.ingest.redact import redact_json_bytes
    from kinetoscope.errors import TraceFormatError, TraceSourceError

    src, out = source.resolve(), target.resolve()
    if out == src or src in out.parents:
        raise ConfigError("OUT must be a directory outside DIR (the originals are kept)")
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ConfigError(f"{target} exists: name a new (or empty) directory for the redacted copy")
    files: list[Path] = []
    other: list[Path] = []
    hidden = 0
    for p in sorted(source.rglob("*")):
        rel = p.relative_to(source)
        if any(part.startswith(".") for part in rel.parts):
            hidden += p.is_file()
        elif p.is_file():
            (files if p.name.lower().endswith(TRACE_SUFFIXES) else other).append(p)
    if not files:
        raise TraceSourceError(f"{source}: directory holds no trace or sidecar (.json, .json.gz) files")
    sidecar = [p.name.lower().endswith(SIDECAR_SUFFIXES) for p in files]
    for p, is_sidecar in zip(files, sidecar, strict=False):  # everything is read before anything is written
        if is_sidecar:
            try:
                msgspec.json.decode(read_bytes(p, limits))
            except msgspec.DecodeError as exc:
                raise TraceFormatError(str(p), f"a sidecar that is not JSON ({exc})") from None
        else:
            load_trace(p, limits)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    changed = 0
    try:
        for p in files:
            cleaned, n = redact_json_bytes(read_bytes(p, limits))
            changed += n
            dest = tmp / p.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(gzip.compress(cleaned, compresslevel=6) if p.name.endswith(".gz") else cleaned)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    traces = len(files) - sum(sidecar)
    left = [f"{hidden} hidden temporar{'ies' if hidden != 1 else 'y'}" if hidden else "",
            f"{len(other)} other file(s) ({', '.join(str(p.relative_to(source)) for p in other[:3])}"
            f"{', ...' if len(other) > 3 else ''})" if other else ""]
    left_out = "; left out: " + ", ".join(x for x in left if x) if any(left) else ""
    print(f"{target}: {traces} trace(s) and {sum(sidecar)} sidecar(s), {changed} string{'s' if changed != 1 else ''} "
          f"redacted{left_out}", file=sys.stderr)
    return EXIT_OK


