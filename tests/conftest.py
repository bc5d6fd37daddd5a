"""Shared by every level (unit/, integration/, acceptance/): tests/ on sys.path, so the helpers in it
(tracebuilder, browserlib, expertlib, hostile, reference_loader) import the same from any folder; the
builder fixture; and the browser fixtures, which import Playwright only when a browser test asks for them."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from tracebuilder import TraceBuilder  # noqa: E402  (tests/ must be on sys.path first)

SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared" / "traces"


def pytest_configure(config: pytest.Config) -> None:
    """A test run started in the background by a non-interactive shell (``cmd &``, ``nohup``) inherits SIGINT
    ignored, and so would every script the tests start: the Ctrl-C tests' scripts would never see it and run on
    (100,000 steps). Ctrl-C's own meaning is put back for the run and, through exec, for what it starts."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def builder() -> type[TraceBuilder]:
    return TraceBuilder


def load_built(tmp_path: Path, b: TraceBuilder, name: str = "trace.json", **kw):
    from kinetoscope.analyze.ingest.loader import load_trace

    return load_trace(b.write(tmp_path / name, **kw))


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium shared by one module's tests (skips where Playwright or Chromium is missing)."""
    from browserlib import launch_browser

    yield from launch_browser()


@pytest.fixture
def page(browser):
    from browserlib import open_page

    yield from open_page(browser)
