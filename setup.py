"""Build the columnar trace scanner (C, nothing beyond Python's headers); every other setting lives
in pyproject.toml. The extension is optional: where it cannot be compiled the package installs
without it and loads traces with the msgspec decoder alone (tests/integration/test_install.py flags that in CI)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kinetoscope.analyze.ingest._scan", ["kinetoscope/analyze/ingest/_scan.c"], optional=True)])
