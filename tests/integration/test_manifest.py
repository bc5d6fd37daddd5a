"""The capture contract (kinetoscope.manifest): one set of records the capture writes and analysis reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from kinetoscope.manifest import Manifest, ManifestFacts, ManifestWindows, StepTimes

CAPTURES = Path(__file__).resolve().parents[2] / "sample_traces" / "captures"
MANIFESTS = sorted(CAPTURES.glob("*/rank-*.manifest.json"))
STEP_TIMES = sorted(CAPTURES.glob("*/rank-*.steps.json"))


def test_there_are_captures_to_check():
    assert len(MANIFESTS) >= 10 and len(STEP_TIMES) == len(MANIFESTS)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_manifest_written_from_the_record_has_the_captures_bytes(path):
    data = path.read_bytes()
    manifest = msgspec.json.decode(data, type=Manifest)
    assert manifest.manifest_version == 2
    assert manifest.to_json() == data


@pytest.mark.parametrize("path", STEP_TIMES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_step_times_written_from_the_record_have_the_captures_bytes(path):
    data = path.read_bytes()
    assert msgspec.json.decode(data, type=StepTimes).to_json() == data


def test_the_readers_views_take_one_part_each():
    """A version-1 manifest named the host by its name: the facts view fails on it, the windows view does not."""
    doc = b'{"manifest_version": 1, "host": "vm", "windows": [{"trace": "t.json.gz", "last_step": 4}]}'
    assert msgspec.json.decode(doc, type=ManifestWindows).windows[0].last_step == 4
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(doc, type=ManifestFacts)


def test_the_contract_is_light():
    """A training job imports it: no numpy, pandas or torch."""
    code = ("import sys, kinetoscope.manifest\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
