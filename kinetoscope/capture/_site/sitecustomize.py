"""Put on PYTHONPATH by ``kinetoscope capture``: profiles an unmodified script.

Only acts when KINETOSCOPE_CAPTURE is set, and then lazily: it imports nothing (not torch, not
Kinetoscope) until the script imports torch itself. A script that sets OMP_NUM_THREADS before
``import torch`` keeps it; a Python process that never imports torch (a helper, ``python -c pass``)
pays nothing. It then hands over to any other ``sitecustomize`` the environment had, so nothing the
user relies on is lost.
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


class _AfterTorch:
    """A finder for ``torch`` alone: it lets the real finder locate torch, and runs the capture's install
    right after torch finishes importing (the script's own ``import torch``)."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _InstallAfter(spec.loader)
                return spec
        return None


class _InstallAfter:
    def __init__(self, inner):  # noqa: ANN001
        self._inner = inner

    def __getattr__(self, name):  # noqa: ANN001, ANN204 - everything else is the real loader's
        return getattr(self._inner, name)

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self._inner.create_module(spec)

    def exec_module(self, module):  # noqa: ANN001
        self._inner.exec_module(module)
        module.__loader__ = self._inner
        try:
            sys.meta_path.remove(_FINDER)
        except ValueError:
            pass
        _install()


def _install() -> None:
    try:
        import multiprocessing

        if multiprocessing.parent_process() is not None:
            return  # a DataLoader worker or another multiprocessing child: it trains nothing
        from kinetoscope.capture.auto import install

        install(os.environ["KINETOSCOPE_CAPTURE"])
    except Exception as exc:  # noqa: BLE001 - never stop the user's script
        sys.stderr.write(f"kinetoscope: capture disabled ({type(exc).__name__}: {exc})\n")


_FINDER = _AfterTorch()
if os.environ.get("KINETOSCOPE_CAPTURE"):
    if "torch" in sys.modules:  # imported already (an earlier sitecustomize, a .pth file)
        _install()
    else:
        sys.meta_path.insert(0, _FINDER)
try:
    _chain_to_next_sitecustomize()
except Exception as exc:  # noqa: BLE001
    sys.stderr.write(f"kinetoscope: could not run the environment's own sitecustomize ({exc})\n")
