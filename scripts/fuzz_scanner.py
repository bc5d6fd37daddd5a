"""Fuzz the C scanner with mutated real traces fed in random chunks (for maintainers; not a test).

Looks for crashes and hangs in ``kinetoscope/analyze/ingest/_scan.c``; the test suite checks that what it
accepts decodes like the reference. Best run against a sanitizer build:

    gcc -g -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fPIC -shared \\
        -I"$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \\
        kinetoscope/analyze/ingest/_scan.c -o /tmp/asan/_scan.so
    ASAN_OPTIONS=detect_leaks=0 \\
    LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \\
        python scripts/fuzz_scanner.py --module /tmp/asan/_scan.so --seconds 300

Run: python scripts/fuzz_scanner.py [--seconds 60] [--seed 1] [--module PATH_TO_SO]
"""

from __future__ import annotations

import argparse
import faulthandler
import gzip
import importlib.util
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENS = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\\u", b"\\ud800", b"\\udc00", b"1e999", b"-",
          b"\xff", b"\xe2\x82", b"\x00", b"null", b'"ph"', b'"args"', b'"C"', b'"traceEvents"', b"9" * 30]


def _load(module: Path | None):  # noqa: ANN202 - the extension module
    if module is None:
        from kinetoscope.analyze.ingest import _scan

        return _scan
    spec = importlib.util.spec_from_file_location("_scan", module)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _sources() -> list[bytes]:
    out = []
    for p in sorted((ROOT / "sample_traces" / "real").glob("*.json*"))[:6]:
        raw = p.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        out.append(data[:300_000])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--module", type=Path, help="a scanner build to test (e.g. with sanitizers)")
    args = ap.parse_args()
    scan = _load(args.module)
    sources = _sources()
    rnd = random.Random(args.seed)
    deadline = time.time() + args.seconds
    cases = accepted = 0
    while time.time() < deadline:
        d = bytearray(rnd.choice(sources))
        for _ in range(rnd.randint(1, 8)):
            if len(d) < 2:
                d = bytearray(b"[{}]")
            i = rnd.randrange(len(d))
            op = rnd.random()
            if op < 0.3:
                d[i] = rnd.randrange(256)
            elif op < 0.5:
                d[i:i] = rnd.choice(TOKENS)
            elif op < 0.7:
                del d[i:i + rnd.randint(1, 50)]
            elif op < 0.8:
                del d[i:]
            else:
                j = rnd.randrange(len(d))
                d[i:i] = d[j:j + rnd.randint(1, 200)]
        data = bytes(d)
        scanner = scan.Scanner(max_depth=rnd.choice([4, 16, 512]), resume=rnd.choice([0, 0, 0, 1, 2]))
        faulthandler.dump_traceback_later(10, exit=True)  # a hang inside the scanner
        pos, final, window, used = 0, False, rnd.randint(1, 5000), 0
        while not final:
            cut = min(len(data), pos + window)
            final = cut == len(data)
            used = scanner.feed(data[pos:cut], final)
            if used < 0:
                break
            pos += used
            window = window * 2 if used == 0 else rnd.randint(1, 5000)  # an item cut short: a larger window
        scanner.finish()
        faulthandler.cancel_dump_traceback_later()
        cases += 1
        accepted += used >= 0
    print(f"{cases} mutated documents, {accepted} accepted, no crash or hang")


if __name__ == "__main__":
    main()
