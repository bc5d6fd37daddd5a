"""What an installation must provide."""

from __future__ import annotations

from kinetoscope.analyze.ingest import scan


def test_the_scanner_is_built_and_used():
    """An install that silently failed to compile the scanner (the extension is optional, for users
    without a compiler) would otherwise pass every test while loading traces several times slower."""
    assert scan._scan is not None, ("kinetoscope/analyze/ingest/_scan.c did not compile: pip install -e . --verbose "
                                    "shows why")
    assert scan.available()
