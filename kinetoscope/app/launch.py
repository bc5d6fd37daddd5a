"""Start the Streamlit app (``kinetoscope app``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kinetoscope.errors import KinetoscopeError
from kinetoscope.sources import trace_path

APP = Path(__file__).resolve().parent / "main.py"
#: how ``kinetoscope app PATH ...`` hands its paths to the Streamlit script
PATHS_ENV = "KINETOSCOPE_APP_PATHS"


def given_paths(value: str) -> list[str]:
    """The paths in ``PATHS_ENV`` (joined by ``os.pathsep``): a URL's ``scheme://`` is not a separator."""
    return [p for p in re.split(re.escape(os.pathsep) + "(?!//)", value) if p]
#: the upload cap the page states (the analysis side enforces it too)
MAX_UPLOAD_MB = 512
#: the theme's primary colour, at a contrast of 5.6:1 on white
PRIMARY_COLOUR = "#c62828"


def bundled_samples() -> Path | None:
    """The repository's sample_traces/ (present in a source checkout or an editable install)."""
    here = Path(__file__).resolve().parents[2] / "sample_traces"
    env = os.environ.get("KINETOSCOPE_SAMPLES")
    for candidate in (Path(env) if env else None, here):
        if candidate is not None and candidate.is_dir():
            return candidate
    return None


def launch(paths: list[str], *, port: int = 8501, headless: bool = False) -> int:
    try:
        import streamlit  # noqa: F401
    except ImportError:
        raise KinetoscopeError("the app needs Streamlit: pip install 'kinetoscope[app]'") from None
    located = [trace_path(p) for p in paths]
    for where in located:
        try:
            found = where.exists()
        except OSError as exc:  # a store that cannot be reached or read
            raise KinetoscopeError(f"{where}: cannot read ({exc.strerror or exc})") from None
        if not found:
            raise KinetoscopeError(f"{where}: no such file or directory")
    command = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port),
        # always headless: Streamlit's own first-run greeting asks for an e-mail on stdin and never serves
        # until answered; the browser is opened here instead, once the server answers
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--server.maxUploadSize", str(MAX_UPLOAD_MB),
        # a local tool, not a Streamlit Cloud app: no Deploy button, no developer menu
        "--client.toolbarMode", "viewer",
        # Streamlit's red (#ff4b4b) is 3.2:1 on white, below the 4.5:1 text needs (slider values, links, the
        # selected page): this red is 5.6:1
        "--theme.primaryColor", PRIMARY_COLOUR,
    ]
    env = dict(os.environ)
    env[PATHS_ENV] = os.pathsep.join(str(p.resolve() if isinstance(p, Path) else p) for p in located)
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    # stopped by a signal (a service manager's SIGTERM, the terminal closing: SIGHUP, SIGQUIT): stop the server
    # too, never leave it orphaned
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, lambda *_: proc.terminate())
    if not headless:
        threading.Thread(target=_open_when_ready, args=(f"http://localhost:{port}", proc), daemon=True).start()
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


def _open_when_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Open the app in the user's browser as soon as it serves (best effort: a headless machine has none)."""
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    print(f"Kinetoscope is serving at {url}", file=sys.stderr, flush=True)
                    webbrowser.open(url)
                    return
        except OSError:
            time.sleep(0.3)
