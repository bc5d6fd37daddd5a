"""What the analysis does not read: event categories it has no rule for, and the accelerators they belong to.

A trace of an accelerator other than CUDA/ROCm GPUs (MTIA, Gaudi/HPU, XPU, ...) holds device and runtime events
under categories of its own. The analyses judge none of them, so such a trace must say so rather than read as
"no problems found".
"""

from __future__ import annotations

import re

from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.results import Coverage, CoverageResult
from kinetoscope.analyze.model.timeline import kind_mask
from kinetoscope.analyze.model.trace import RankTrace, training_children

#: categories (and distributed backends) of accelerators the analyses do not read, with their usual names
_ACCELERATORS = (
    (re.compile(r"mtia", re.I), "MTIA"),
    (re.compile(r"hpu|habana|gaudi|synapse", re.I), "Gaudi (HPU)"),
    (re.compile(r"xpu|level_zero|sycl", re.I), "Intel XPU"),
    (re.compile(r"npu|ascend", re.I), "NPU"),
    (re.compile(r"tpu|xla", re.I), "TPU/XLA"),
    (re.compile(r"privateuse", re.I), "a PrivateUse1 backend"),
)


def _accelerator(text: str) -> str | None:
    return next((name for pattern, name in _ACCELERATORS if pattern.search(text)), None)


@register("coverage", "What the analysis does not read")
def analyze_coverage(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Events of categories no analysis reads, by category, and the accelerators they belong to."""
    ev = trace.events
    other = ev[kind_mask(ev, ("other",))]
    counts = {str(c): int(n) for c, n in other["cat"].value_counts(sort=True).items() if n}
    accelerators: dict[str, dict[str, int]] = {}
    for cat, n in counts.items():
        name = _accelerator(cat)
        if name is not None:
            accelerators.setdefault(name, {})[cat] = n
    backend = str((trace.meta.distributed_info or {}).get("backend") or "")
    for part in backend.split(","):
        name = _accelerator(part.split(":", 1)[0])
        if name is not None:
            accelerators.setdefault(name, {})
    metrics = Coverage(unread_events=counts or None, accelerators_unread=sorted(accelerators) or None)
    findings = []
    for name, cats in sorted(accelerators.items()):
        events = sum(cats.values())
        what = (f"{events:,} of its events ({', '.join(f'{c}: {n:,}' for c, n in cats.items())})" if events
                else f"a process group on it (backend {backend})")
        findings.append(
            Finding(
                id="accelerator_unread",
                rank=trace.rank,
                title=(
                    f"The trace holds {name} accelerator work that Kinetoscope does not analyse - {what}: its device "
                    "time, idle, copies and launches are not judged, so no finding here speaks for that device"
                ),
                evidence={"accelerator": name, "events_by_category": cats, "distributed_backend": backend or None},
                recommendation=(
                    f"Read the {name} timeline with its vendor's tools (or the trace in Perfetto); Kinetoscope's "
                    "host-side findings (data loading, the training loop's phases) still hold."
                ),
            )
        )
    children = training_children(trace.meta.capture)
    if children is not None:
        started, targets = children
        named = f" ({', '.join(targets)})" if targets else ""
        findings.append(
            Finding(
                id="training_in_children",
                rank=trace.rank,
                title=(
                    f"The window holds no training steps: this process ran no backward() and no optimizer step; "
                    f"the training ran in {started} Python child process{'es' if started != 1 else ''}{named} the "
                    "capture does not follow"
                ),
                evidence={"child_processes": started, "targets": list(targets), "backward_calls": 0,
                          "optimizer_steps": 0},
                recommendation=(
                    "This report is about the parent's own work, not the training. To profile a trainer, start "
                    "Kinetoscope's Profiler inside the child's training function, or start the children with "
                    "torch.multiprocessing.spawn (kinetoscope capture profiles each as a rank)."
                ),
            )
        )
    return AnalysisResult(key="coverage", metrics=CoverageResult(coverage=metrics), findings=tuple(findings))

