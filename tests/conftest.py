from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from tracebuilder import TraceBuilder  # noqa: E402

SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared" / "traces"


@pytest.fixture
def builder() -> type[TraceBuilder]:
    return TraceBuilder


def load_built(tmp_path: Path, b: TraceBuilder, name: str = "trace.json", **kw):
    from kinetoscope.analyze.ingest.loader import load_trace

    return load_trace(b.write(tmp_path / name, **kw))
