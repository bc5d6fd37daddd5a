"""Put on PYTHONPATH by ``kinetoscope capture``: profiles an unmodified script.

Only acts when KINETOSCOPE_CAPTURE is set, then hands over to any other
``sitecustomize`` the environment had, so nothing the user relies on is lost.
"""

import os
import sys


def _chain_to_next_sitecustomize() -> None:
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_kinetoscope_chained_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get("KINETOSCOPE_CAPTURE"):
    try:
        from kinetoscope.capture.auto import install

        install(os.environ["KINETOSCOPE_CAPTURE"])
    except Exception as exc:  # noqa: BLE001 - never stop the user's script
        sys.stderr.write(f"kinetoscope: capture disabled ({type(exc).__name__}: {exc})\n")
try:
    _chain_to_next_sitecustomize()
except Exception as exc:  # noqa: BLE001
    sys.stderr.write(f"kinetoscope: could not run the environment's own sitecustomize ({exc})\n")
