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
        from kinetoscope.capture.auto import install

        install(os.environ["KINETOSCOPE_CAPTURE"])
    except Exception as exc:  # noqa: BLE001 - never stop the user's script
        sys.stderr.write(f"kinetoscope: capture disabled ({type(exc).__name__}: {exc})\n")


def _multiprocessing_child() -> bool:
    """A process multiprocessing started (spawn, forkserver): a DataLoader worker, a pool worker, a hogwild
    trainer, or a torch.multiprocessing.spawn rank. Its command line says so from the very start."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return any(a == "--multiprocessing-fork" or "multiprocessing.forkserver" in a
               or "multiprocessing.resource_tracker" in a for a in argv)


def _profile_spawned_ranks() -> None:
    """In a multiprocessing child: capture only if it runs a torch.multiprocessing.spawn rank (the target is
    known once the child unpickles its Process object, after torch is imported); others stay untouched."""
    import multiprocessing.process as mp_process

    # _bootstrap is CPython's private method: typeshed does not declare it
    original = mp_process.BaseProcess._bootstrap  # type: ignore[attr-defined]

    def _bootstrap(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        target = getattr(self, "_target", None)
        if (
            getattr(target, "__module__", "") == "torch.multiprocessing.spawn"
            and getattr(target, "__name__", "") == "_wrap"
        ):
            _install()
        return original(self, *args, **kwargs)

    mp_process.BaseProcess._bootstrap = _bootstrap  # type: ignore[attr-defined]


def _launched_or_a_rank() -> bool:
    """The process ``kinetoscope capture`` launched, or a direct child of a process that installed capture
    without training (torchrun's workers). Subprocesses of a training process are not (an eval script)."""
    parent = os.environ.get("KINETOSCOPE_CAPTURE_PARENT")
    return parent is None or parent == str(os.getppid())


def _note_started() -> None:
    """Tell the CLI this process was reached (a command that ignores PYTHONPATH never is: python -I / -E)."""
    try:
        import json

        out = json.loads(os.environ["KINETOSCOPE_CAPTURE"]).get("out_dir")
        if out and os.path.isdir(out):
            path = os.path.join(out, f".kinetoscope-status-{os.getpid()}.json")
            with open(path, "w") as fh:
                json.dump({"pid": os.getpid(), "python": True}, fh)  # no command line: it may hold secrets
    except Exception:  # noqa: BLE001
        pass


_FINDER = _AfterTorch()
if os.environ.get("KINETOSCOPE_CAPTURE"):
    if _multiprocessing_child():
        try:
            _profile_spawned_ranks()
        except Exception:  # noqa: BLE001
            pass
    elif _launched_or_a_rank():
        _note_started()
        if "torch" in sys.modules:  # imported already (an earlier sitecustomize, a .pth file)
            _install()
        else:
            sys.meta_path.insert(0, _FINDER)
try:
    _chain_to_next_sitecustomize()
except Exception as exc:  # noqa: BLE001
    sys.stderr.write(f"kinetoscope: could not run the environment's own sitecustomize ({exc})\n")
