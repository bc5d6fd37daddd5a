"""python -m kinetoscope: the same as the kinetoscope command."""

from kinetoscope.cli import run

run()
