"""Stage 4 of the pipeline, the what-if: what each finding's fix is worth.

Takes a ``RankTrace`` and its findings (from the analyzers, through the registry); gives each finding's estimate
and the estimate of several fixes together, from a replay of the rank's steps with the fix applied as an edit.
Imports ``model`` only: the views a fix needs live there, not in an analyzer.
"""

from kinetoscope.analyze.model.estimate import Estimate
from kinetoscope.analyze.whatif.commroles import comm_roles_entry
from kinetoscope.analyze.whatif.critpath import (
    CriticalPath,
    Segment,
    StepPath,
    critical_path,
    critical_path_entry,
    fix_limits,
)
from kinetoscope.analyze.whatif.estimate import combined, estimate, replay_entry
from kinetoscope.analyze.whatif.fixes import (
    FIXES,
    PARAMS,
    Fix,
    Plan,
    check_params,
    edited_by,
    params_for,
    plan_for,
    plan_from_measure,
    straggler_saving_us,
)
from kinetoscope.analyze.whatif.graph import ReplayGraph, replay_graph
from kinetoscope.analyze.whatif.loader_queue import LoaderFix, infer_worker_loads, simulate_loader, stalled
from kinetoscope.analyze.whatif.replay import Edits, Replayed, apply, baseline, replay

__all__ = ["CriticalPath", "Edits", "Estimate", "Segment", "StepPath", "comm_roles_entry", "critical_path",
           "critical_path_entry",
           "fix_limits", "FIXES", "Fix", "LoaderFix", "PARAMS", "Plan", "ReplayGraph", "Replayed", "apply",
           "baseline", "check_params", "combined", "edited_by", "estimate", "infer_worker_loads", "params_for",
           "plan_for", "plan_from_measure", "replay", "replay_entry", "replay_graph", "simulate_loader", "stalled",
           "straggler_saving_us"]
