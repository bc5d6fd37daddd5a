"""Compare a report with an expert's hand-written reading of the same trace (``tests/expert/*.toml``).

An expert reading lists the findings an expert raises on a trace (id, rank, severity, and why) and the
ones a careless tool might raise but an expert would not. A tool's warning or critical finding that the
expert does not raise at warning or critical is a false positive; one at a higher severity than the
expert's overclaims. The expert's warnings and criticals the tool misses count against recall. Info
findings are statements, not claims, and count for neither.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetoscope.analyze.model.findings import SEVERITY_ORDER, Finding

CLAIMS = ("critical", "warning")


@dataclass(frozen=True)
class ExpertReading:
    name: str
    trace: str
    copy: str | None
    expected: dict[tuple[str, int], str]
    refused: frozenset[tuple[str, int]]
    doc: dict[str, Any] = field(repr=False, default_factory=dict)

    def path(self, root: Path) -> Path | None:
        """The trace to read: the shared original when present, else the bundled copy."""
        for candidate in (self.trace, self.copy):
            if candidate and (root / candidate).exists():
                return root / candidate
        return None


def read_expert(path: Path) -> ExpertReading:
    doc = tomllib.loads(path.read_text())
    expected = {(f["id"], int(f.get("rank", 0))): f["severity"] for f in doc.get("finding", [])}
    refused = frozenset((f["id"], int(f.get("rank", 0))) for f in doc.get("not", []))
    return ExpertReading(name=path.stem, trace=doc["trace"], copy=doc.get("copy"), expected=expected,
                         refused=refused, doc=doc)


@dataclass(frozen=True)
class Agreement:
    #: the tool's claims (warning/critical) the expert also makes, at any claim severity
    true_positives: list[tuple[str, int]]
    #: the tool's claims the expert does not make
    false_positives: list[tuple[str, int, str]]
    #: the tool's claims at a higher severity than the expert's
    overclaimed: list[tuple[str, int, str, str]]
    #: the expert's claims the tool does not make (at warning or critical)
    missed: list[tuple[str, int, str]]
    #: the tool's claim at a lower severity than the expert's (a claim made, less strongly)
    underclaimed: list[tuple[str, int, str, str]]


def compare(reading: ExpertReading, findings: list[Finding] | tuple[Finding, ...]) -> Agreement:
    tool = {}
    for f in findings:
        key = (f.id, int(f.rank if f.rank is not None else 0))
        if key not in tool or SEVERITY_ORDER[f.severity] < SEVERITY_ORDER[tool[key]]:
            tool[key] = f.severity
    claims = {k: s for k, s in tool.items() if s in CLAIMS}
    expert_claims = {k: s for k, s in reading.expected.items() if s in CLAIMS}
    tp, fp, over, under = [], [], [], []
    for key, sev in sorted(claims.items()):
        if key in expert_claims:
            tp.append(key)
            if SEVERITY_ORDER[sev] < SEVERITY_ORDER[expert_claims[key]]:
                over.append((*key, sev, expert_claims[key]))
            elif SEVERITY_ORDER[sev] > SEVERITY_ORDER[expert_claims[key]]:
                under.append((*key, sev, expert_claims[key]))
        else:
            fp.append((*key, sev))
    missed = [(*key, sev) for key, sev in sorted(expert_claims.items()) if key not in claims]
    return Agreement(true_positives=tp, false_positives=fp, overclaimed=over, missed=missed, underclaimed=under)
