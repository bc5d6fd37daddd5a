"""Stage 4 of the pipeline, the what-if: what each finding's fix is worth.

Takes a ``RankTrace`` and its findings (from the analyzers, through the registry); gives each finding's estimate
and the estimate of several fixes together, from a replay of the rank's steps with the fix applied as an edit.
Imports ``model`` only: the views a fix needs live there, not in an analyzer.
"""
