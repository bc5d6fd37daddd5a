"""A trace read from S3 against the same trace read from disk: time and peak memory of `kinetoscope analyze`.

    python benchmarks/remote_read.py [--steps 150] [--runs 3]

Writes an event-dense trace (benchmarks/dense_trace.py), starts moto's S3 server on 127.0.0.1 (a dev dependency),
uploads the trace and runs `kinetoscope analyze --format json` on the file and on its s3:// URL, each in its own
process; checks the two reports are the same but for the file's name, and prints wall time and peak RSS (medians).
The server runs in this process, so the remote read pays for a local HTTP server too: an upper bound of the cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dense_trace import write_dense_trace  # noqa: E402


def run(target: str) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, stdout) of one `kinetoscope analyze` process."""
    code = ("import resource, sys; from kinetoscope.cli import main; rc = main(sys.argv[1:]); "
            "sys.stdout.flush(); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, "analyze", target, "--format", "json"],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    return wall, int(proc.stderr.strip().splitlines()[-1]) / 1024, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir("bench")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dense.json.gz"
        json_bytes = write_dense_trace(path, args.steps, gz=True)
        fs.put_file(str(path), "bench/dense.json.gz")
        url = "s3://bench/dense.json.gz"
        results: dict[str, list[tuple[float, float]]] = {"file": [], "s3": []}
        reports = {}
        for _ in range(args.runs):
            for name, target in (("file", str(path)), ("s3", url)):
                wall, rss, out = run(target)
                results[name].append((wall, rss))
                reports[name] = out
        same = reports["s3"] == reports["file"].replace(str(path), url)
        size = path.stat().st_size / 2**20
        print(f"dense trace: {args.steps} steps, {json_bytes / 2**20:.0f} MiB of JSON, {size:.1f} MiB gzipped; "
              f"reports identical but for the name: {same}")
        for name, rows in results.items():
            print(f"  {name:4s}: {statistics.median(w for w, _ in rows):.2f} s, "
                  f"peak RSS {statistics.median(r for _, r in rows):.0f} MiB (median of {len(rows)})")
    server.stop()


if __name__ == "__main__":
    main()
