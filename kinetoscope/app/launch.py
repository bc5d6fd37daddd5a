"""Start the Streamlit app (``kinetoscope app``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kinetoscope.errors import KinetoscopeError

APP = Path(__file__).resolve().parent / "main.py"
#: how ``kinetoscope app PATH ...`` hands its paths to the Streamlit script
PATHS_ENV = "KINETOSCOPE_APP_PATHS"
#: the upload cap the page states (the analysis side enforces it too)
MAX_UPLOAD_MB = 512


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
    for p in paths:
        if not Path(p).exists():
            raise KinetoscopeError(f"{p}: no such file or directory")
    command = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port),
        "--server.headless", "true" if headless else "false",
        "--browser.gatherUsageStats", "false",
        "--server.maxUploadSize", str(MAX_UPLOAD_MB),
    ]
    env = dict(os.environ)
    env[PATHS_ENV] = os.pathsep.join(str(Path(p).resolve()) for p in paths)
    return subprocess.call(command, env=env)
