"""The app through streamlit.testing: it opens on the bundled samples and shows findings."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = Path(__file__).resolve().parents[1] / "kinetoscope" / "app" / "main.py"


def test_opens_on_the_bundled_samples_with_findings():
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.exception
    assert at.title[0].value == "Kinetoscope"
    labels = [e.label for e in at.expander]
    assert any("loader" in label.lower() or "data loading" in label.lower() for label in labels), labels


@pytest.mark.parametrize("needle", ["hta_2rank", "cpu/healthy", "rank-34"])
def test_every_kind_of_sample_renders(needle):
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    box = at.selectbox(key="trace")
    option = next(o for o in box.options if needle in o)
    at = box.select(option).run()
    assert not at.exception
    assert not at.error
