"""Beside the pipeline, not a stage of it: other tools' numbers on the same trace, to check ours against.

Takes a ``Trace`` (and the optional ``kinetoscope[hta]`` extra); gives HTA's figures for the quantities both tools
compute (``hta``). Used by tests and ``scripts/compare_hta.py``; nothing in the pipeline imports it.
"""
