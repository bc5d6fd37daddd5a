"""``kinetoscope capture --out s3://...``: the run writes into a local staging folder, and this process (the
``capture`` command's, never the training job's: it does not import fsspec) uploads each file once it is written.

Files land in the staging folder under their final names only when whole (each is written to a hidden temporary
name, then renamed), so a file seen there is uploaded as it is, once per version (size and mtime). The capture
manifests are uploaded last, after the run: a manifest beside a trace says the run is over
(``kinetoscope batch --watch`` takes the job as complete then).
"""

from __future__ import annotations

import threading
from pathlib import Path

from kinetoscope.sources import RemotePath

#: how often the staging folder is looked at during the run
PERIOD_S = 2.0


def _last(name: str) -> bool:
    """Written when the run ends and saying so: uploaded after everything else."""
    return name.endswith(".manifest.json")


class Uploader:
    """Uploads ``staging``'s files to ``dest`` on a thread during the run; ``finish`` uploads the rest, manifests
    last, and returns the names uploaded. Upload errors are kept (``errors``) and said once the run is over: the
    training job is never stopped for them."""

    def __init__(self, staging: Path, dest: RemotePath, period_s: float = PERIOD_S) -> None:
        self.staging, self.dest, self.period_s = staging, dest, period_s
        self.uploaded: dict[str, tuple[int, int]] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kinetoscope-upload", daemon=True)

    def start(self) -> Uploader:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sweep(final=False)

    def sweep(self, final: bool) -> None:
        if not self.staging.is_dir():
            return
        files = sorted((p for p in self.staging.iterdir() if p.is_file() and not p.name.startswith(".")),
                       key=lambda p: (_last(p.name), p.name))
        for p in files:
            if _last(p.name) and not final:
                continue
            try:
                st = p.stat()
            except OSError:  # renamed away meanwhile
                continue
            version = (st.st_size, st.st_mtime_ns)
            if self.uploaded.get(p.name) == version:
                continue
            try:
                (self.dest / p.name).upload(p)
            except OSError as exc:
                self.errors.append(f"{self.dest / p.name}: {exc.strerror or exc}")
                continue
            self.uploaded[p.name] = version

    def finish(self) -> list[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sweep(final=True)
        return sorted(self.uploaded)
