"""Precision and recall of the report against the expert readings, set by set.

A claim is a warning or critical finding (id, rank). Precision: the tool's claims the expert also makes;
recall: the expert's claims the tool makes. The sets are kept apart, because only readings the analysis was not
tuned on say how it generalises:

- in-sample: tests/expert/*.toml, the readings the analysis was built against (traces bundled or in ../shared);
- public, dev: tests/expert/public_dev/ - public traces first read for issue 28 and then used to find what the
  analysis got wrong (out of sample before, in sample since);
- public, held out: tests/expert/public_heldout/ - public traces set aside at random and read independently; the
  analysis was not changed after their readings;
- captures, held out: tests/expert/captures/ - real public training code captured with Kinetoscope (bundled in
  sample_traces/captures/), read independently, likewise;
- a second held-out set (issue 28, second round): tests/expert/heldout2_public/ (8 TraceLens test traces nobody here
  had read) and tests/expert/heldout2_captures/ (12 new captures of public training code, bundled in
  sample_traces/heldout2/ but for the 17 MB tsp_lbfgs, which goes in the public folder as heldout2_tsp_lbfgs), read
  by independent readers and scored once before any change; one rule was changed after them (zero_grad_missing
  under accumulation), so they are in sample for it since.
- a third held-out set (issue 28, third round): tests/expert/heldout3_captures/ (13 captures of public training code
  never captured before, bundled in sample_traces/heldout3/), read by an independent reader before the tool ran on
  them; a second reader read the same captures on their own (heldout3_captures_b/), to show how far two experts
  agree.
- a fourth held-out set: the third set's 13 programs captured again after the capture learned to record the
  training thread's run-queue wait (sample_traces/heldout4/), read by two new independent readers (heldout4_captures/
  and heldout4_captures_b/) before the tool ran on them. No analysis rule was changed after any reading of it.
- a fifth held-out set: twelve programs never captured before (sample_traces/heldout5/), captured by a helper who
  never ran the analysis, read by two independent readers (heldout5_captures/ and heldout5_captures_b/) before the
  tool ran on them; scored once.
- a sixth held-out set: twelve more programs or configurations (sample_traces/heldout6/), captured the same way on a
  quiet machine, read by two new independent readers (heldout6_captures/ and heldout6_captures_b/), committed before
  the tool ran on them; scored once, then rules were changed after it (in sample for them since).
- a seventh held-out set: twelve more (sample_traces/heldout7/), captured and read the same way, scored once on the
  code the sixth set's rules made (caa96bf), before any change; then two rules were changed after it.
- an eighth held-out set: twelve more (sample_traces/heldout8/), likewise, scored once on the code after the seventh
  set's rules (e1beb4f).
- a ninth held-out set: twelve more (sample_traces/heldout9/), likewise, scored once on the code after the eighth
  set's rules (5257f5b).
- a tenth held-out set: twelve more (sample_traces/heldout10/), captured with the capture that times its own trace
  writing, scored once on the code after the ninth set's rule (2366b5c).
- an eleventh held-out set: twelve more (sample_traces/heldout11/), captured at 6039d9a, scored once on the code
  after the tenth set's rules (fdfd587).
- a twelfth held-out set: twelve more (sample_traces/heldout12/), captured at cac6ac8 (with the launcher's count of
  ranks per host), scored once on the code after the eleventh set's straggler bar.
- a thirteenth held-out set: twelve more (sample_traces/heldout13/), captured at acff3d2 (with the training thread's
  own CPU in its data waits), scored once on the code after the twelfth set's rules (9aec366), against two readers
  and their consensus, reconciled blind to the tool by a third.
- a fourteenth held-out set: twelve more (sample_traces/heldout14/), captured at e8ce625 (after the thirteenth set's
  rules), scored once on that code, against two readers and their blind consensus.
- a fifteenth held-out set: twelve more (sample_traces/heldout15/), captured at c900596 (after the review of the
  thirteenth set's rules) while a test run shared the machine, scored once on that code, likewise.
- a sixteenth held-out set: twelve more (sample_traces/heldout16/), captured at 9f38f1f on a quiet machine, scored
  once on the code after the fifteenth set's rules (56de25d), likewise.
- a seventeenth held-out set: twelve more (sample_traces/heldout17/), captured at 48d84e8 alone on the machine, scored
  once on the code after the sixteenth set's rule (3120c9e; tests only since), likewise.
- an eighteenth held-out set: twelve more (sample_traces/heldout18/), captured at b61a8bc alone on the machine,
  scored once on the code after the seventeenth set's rules, likewise.
- a nineteenth held-out set: twelve more (sample_traces/heldout19/), captured at 1a3cdb5 alone on the machine, scored
  once on the code after the eighteenth set's rule (1a3cdb5, the final analysis code), likewise.
- a twentieth held-out set: twelve more (sample_traces/heldout20/), captured at e4441f6 alone on the machine, scored
  once on the same final analysis code, likewise.
- a twenty-first held-out set: twelve more (sample_traces/heldout21/), captured at 9788481 (with the capture's measure
  of a worker's hand-over) on a quiet machine, scored once on that code, likewise.
- a twenty-second held-out set: twelve more (sample_traces/heldout22/), captured at 6cd32df (the same capture and
  analysis code) on a quiet machine, scored once on that code, likewise.
- a twenty-third held-out set: twelve more (sample_traces/heldout23/), captured at 1491170 (the same capture and
  analysis code; a test-harness change since) on a quiet machine, scored once on that code, likewise.
- a twenty-fourth held-out set: twelve more (sample_traces/heldout24/), captured at 056b010 (the same capture and
  analysis code) on a quiet machine, scored once at 0597f7a (a hang test's fix and the hand-over probe for loaders
  with workers since, neither of which its captures reach), likewise.
- a twenty-fifth held-out set: twelve more (sample_traces/heldout25/), captured at 7887f63 (the hand-over probe for
  loaders with workers, the CPU bound on gloo overlap) on a machine one of the session's test runs loaded, scored
  once at 9b29edb, likewise.
- a twenty-sixth held-out set: twelve more (sample_traces/heldout26/), captured at a7e6d7e (the same, with the
  review's fixes) on a quiet machine, scored once at 302880f (the same analysis code), likewise.
- a twenty-seventh held-out set: twelve more (sample_traces/heldout27/), captured at 5734a13 (the lateness shared
  inside a step, the cores the compute leaves free) on a quiet machine, scored once at 2df168a, likewise.
- a twenty-eighth held-out set: twelve more (sample_traces/heldout28/), captured at 4a94c67 (the review's fixes to
  both) on a quiet machine, scored once at 9364f52, likewise.
- a twenty-ninth held-out set: twelve more (sample_traces/heldout29/), captured at 875478f (the final analysis code)
  on a quiet machine, scored once at 6a5b3af, likewise.
- a thirtieth held-out set: twelve more (sample_traces/heldout30/), captured at 05e55c5 (the capture that describes
  each loader's dataset) on a quiet machine, scored once at bd4d4bb, likewise.
- a thirty-first held-out set: twelve more (sample_traces/heldout31/), captured at d5375ae on a quiet machine, scored
  once at 9bd36fc on the code of b1637cc, likewise.

Public traces are not bundled (fetched test data of other projects): put them in one folder and name it with
KINETOSCOPE_PUBLIC_TRACES; a reading whose trace is not here is listed as such.
Run: python scripts/expert_agreement.py [--markdown]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from expertlib import compare, read_expert  # noqa: E402

from kinetoscope.analyze.ingest.loader import find_jobs, load_job  # noqa: E402
from kinetoscope.analyze.report.builder import build_report  # noqa: E402

EXPERT = ROOT / "tests" / "expert"

#: the held-out sets read by two independent readers (from the thirteenth on, also their blind consensus): their
#: number, ordinal and what the first reader's table is titled
HELD_OUT = ((3, "third", "captures of public training code"),
            (4, "fourth", "the same programs recaptured with scheduler statistics"),
            (5, "fifth", "twelve programs never captured before"),
            (6, "sixth", "twelve more programs, captured on a quiet machine"),
            (7, "seventh", "twelve more programs, scored on the code after the sixth"),
            (8, "eighth", "twelve more programs, scored on the code after the seventh"),
            (9, "ninth", "twelve more programs, scored on the code after the eighth"),
            (10, "tenth", "twelve more programs, scored on the code after the ninth"),
            (11, "eleventh", "twelve more programs, scored on the code after the tenth"),
            (12, "twelfth", "twelve more programs, scored on the code after the eleventh"),
            (13, "thirteenth", "twelve more programs, scored on the code after the twelfth"),
            (14, "fourteenth", "twelve more programs, scored on the code after the thirteenth"),
            (15, "fifteenth", "twelve more programs, scored on the code after the review"),
            (16, "sixteenth", "twelve more programs, scored on the code after the fifteenth's rules"),
            (17, "seventeenth", "twelve more programs, scored on the code after the sixteenth's rule"),
            (18, "eighteenth", "twelve more programs, scored on the code after the seventeenth's rules"),
            (19, "nineteenth", "twelve more programs, scored on the code after the eighteenth's rule"),
            (20, "twentieth", "twelve more programs, scored on the final analysis code"),
            (21, "twenty-first", "twelve more programs, captured with the measured hand-over"),
            (22, "twenty-second", "twelve more programs, four loading in the training process"),
            (23, "twenty-third", "twelve more programs, on the same code"),
            (24, "twenty-fourth", "twelve more programs, on the same code"),
            (25, "twenty-fifth", "twelve more programs, with the probe for loaders with workers"),
            (26, "twenty-sixth", "twelve more programs, after the review's fixes"),
            (27, "twenty-seventh", "twelve more programs, after the gloo overlap was measured"),
            (28, "twenty-eighth", "twelve more programs, after the review of the gloo rules"),
            (29, "twenty-ninth", "twelve more programs, on the final code"),
            (30, "thirtieth", "twelve more programs, with the loaders' datasets described"),
            (31, "thirty-first", "twelve more programs, on this stop's final code"),
            (32, "thirty-second", "twelve more programs, on the previous stop's final code"),
            (33, "thirty-third", "twelve more programs, with the host advice of 646cd43"),
            (34, "thirty-fourth", "twelve more programs, on the capture code of ef104c9"),
            (35, "thirty-fifth", "twelve more programs, on this stop's final rule"),
            (36, "thirty-sixth", "twelve more programs, on this stop's final code"),
            (37, "thirty-seventh", "twelve more programs, after the thirty-sixth's two rules"),
            (38, "thirty-eighth", "twelve more programs, after the review of those rules"),
            (39, "thirty-ninth", "twelve more programs, on the final straggler rule"),
            (40, "fortieth", "twelve more programs, on the scaled straggler and host memory"),
            (41, "forty-first", "twelve more programs, with the host's memory recorded"),
            (42, "forty-second", "twelve more programs, on this stop's final code"),
            (43, "forty-third", "twelve more programs, on the final code after its CI"),
            (44, "forty-fourth", "twelve more programs, with loader waits told by batch"),
            (45, "forty-fifth", "twelve more programs, on the per-item Python rule"),
            (46, "forty-sixth", "twelve more programs, after a fresh review's fixes"),
            (47, "forty-seventh", "twelve more programs, before this stop's last rule"),
            (48, "forty-eighth", "twelve more programs, on this stop's final code"),
            (49, "forty-ninth", "twelve more programs, on the previous stop's final code"),
            (50, "fiftieth", "twelve more programs, after FSDP's replication was measured"),
            (51, "fifty-first", "twelve more programs, on this stop's final code after its CI"),
            (52, "fifty-second", "twelve more programs, with grad-off evaluations marked"),
            (53, "fifty-third", "twelve more programs, after the fifty-second's straggler rule"),
            (54, "fifty-fourth", "twelve more programs, after the second review of that rule"),
            (55, "fifty-fifth", "twelve more programs, on this stop's final code after its CI"),
            (56, "fifty-sixth", "twelve more programs, after the loader replay's ready batches"),
            (57, "fifty-seventh", "twelve more programs, after that rule's review"),
            (58, "fifty-eighth", "twelve more programs, on this stop's final code after its CI"),
            (59, "fifty-ninth", "twelve more programs, on the previous stop's final code, unchanged"),
            (60, "sixtieth", "twelve more programs, on the same code"),
            (61, "sixty-first", "twelve more programs, on the same code"),
            (62, "sixty-second", "twelve more programs, on the same code"),
            (63, "sixty-third", "twelve more programs, on the same code"),
            (64, "sixty-fourth", "twelve more programs, on the same code"),
            (65, "sixty-fifth", "twelve more programs, on the same code"))
#: the first set read by a third expert reconciling the two readings
FIRST_CONSENSUS = 13


def _held_out(n: int, ordinal: str, title: str) -> tuple[tuple[str, Path], ...]:
    """A held-out set's readings: the first reader's, the second's and, where made, their consensus."""
    readers = ((f"{ordinal} held-out set: {title}", ""), (f"{ordinal} held-out set, second independent reader", "_b"))
    if n >= FIRST_CONSENSUS:
        readers += ((f"{ordinal} held-out set, the two readers' consensus", "_c"),)
    return tuple((name, EXPERT / f"heldout{n}_captures{suffix}") for name, suffix in readers)


SETS = (("in-sample", EXPERT),
        ("public traces, dev (used to find errors)", EXPERT / "public_dev"),
        ("public traces, held out", EXPERT / "public_heldout"),
        ("captures of public training code, held out", EXPERT / "captures"),
        ("second held-out set: public traces", EXPERT / "heldout2_public"),
        ("second held-out set: captures of public training code", EXPERT / "heldout2_captures"),
        *(entry for n, ordinal, title in HELD_OUT for entry in _held_out(n, ordinal, title)))


def _claims(items: dict[tuple[str, int], str]) -> str:
    shown = [f"{i} ({s}, r{r})" for (i, r), s in sorted(items.items()) if s in ("critical", "warning")]
    return ", ".join(shown) or "-"


def trace_of(reading) -> Path | None:  # type: ignore[no-untyped-def]
    if reading.trace.startswith("public/"):
        base = os.environ.get("KINETOSCOPE_PUBLIC_TRACES")
        path = Path(base) / reading.trace.split("/", 1)[1] if base else None
        return path if path is not None and path.exists() else None
    return reading.path(ROOT)


def agreement(folder: Path) -> tuple[list[str], dict[str, int]]:
    rows, counts = [], {"tp": 0, "fp": 0, "missed": 0, "over": 0, "readings": 0, "absent": 0}
    for path in sorted(folder.glob("*.toml")):
        reading = read_expert(path)
        trace = trace_of(reading)
        if trace is None:
            counts["absent"] += 1
            rows.append(f"| {path.stem} | (trace not here) | | |")
            continue
        # a capture directory holding several windows is several jobs: a claim on any window counts
        found = [f for job in find_jobs(trace) for f in build_report(load_job(job)).findings]
        a = compare(reading, found)
        tool: dict[tuple[str, int], str] = {}
        for f in found:
            key = (f.id, f.rank or 0)
            if key not in tool or f.severity in ("critical",) or (f.severity == "warning" and tool[key] == "info"):
                tool[key] = f.severity
        counts["readings"] += 1
        counts["tp"] += len(a.true_positives)
        counts["fp"] += len(a.false_positives)
        counts["missed"] += len(a.missed)
        counts["over"] += len(a.overclaimed)
        notes = []
        if a.false_positives:
            notes.append("false: " + ", ".join(f"{i} r{r}" for i, r, _ in a.false_positives))
        if a.missed:
            notes.append("missed: " + ", ".join(f"{i} r{r}" for i, r, _ in a.missed))
        if a.overclaimed:
            notes.append("too strong: " + ", ".join(f"{i} r{r} {s} vs {e}" for i, r, s, e in a.overclaimed))
        if a.underclaimed:
            notes.append("weaker: " + ", ".join(f"{i} r{r} {s} vs {e}" for i, r, s, e in a.underclaimed))
        rows.append(f"| {path.stem} | {_claims(reading.expected)} | {_claims(tool)} | {'; '.join(notes) or 'agree'} |")
    return rows, counts


def main() -> None:
    for name, folder in SETS:
        if not folder.is_dir():
            continue
        rows, c = agreement(folder)
        tp, fp, missed = c["tp"], c["fp"], c["missed"]
        precision = tp / (tp + fp) if tp + fp else 1.0
        recall = tp / (tp + missed) if tp + missed else 1.0
        print(f"### {name}\n")
        print(f"{c['readings']} readings analysed" + (f" ({c['absent']} traces not here)" if c["absent"] else "")
              + f": the tool makes {tp + fp} claims, the experts {tp + missed}; {tp} agree. **Precision "
              f"{precision:.2f}** ({fp} claims an expert would not make), **recall {recall:.2f}** ({missed} expert "
              f"claims missed), {c['over']} at a higher severity than the expert's.\n")
        print("| reading | expert's claims | tool's claims | agreement |")
        print("|---|---|---|---|")
        print("\n".join(rows))
        print()


if __name__ == "__main__":
    main()
