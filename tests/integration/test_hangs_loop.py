"""Real hangs under ``profile_loop`` (no ``kinetoscope capture``): ``torchrun --standalone --nproc-per-node 2`` with
gloo on CPU, the script wrapping its DataLoader in ``profile_loop(..., hang_timeout_s=5)``, one rank going wrong in
step 4 (after 4 all_reduces: the ranks part at #5). The diagnosis must be the one ``kinetoscope capture`` gives
(``test_hangs_real.py``): the ranks, the op, the sequence number and the stuck rank's frame."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

from kinetoscope.analyze.ingest.jobs import find_jobs  # noqa: E402
from kinetoscope.analyze.ingest.loader import load_job  # noqa: E402
from kinetoscope.analyze.report.builder import build_report  # noqa: E402

SCRIPT = '''\
import sys, threading
import torch, torch.distributed as dist
from datetime import timedelta
from kinetoscope.capture import profile_loop

KIND, BAD, OUT, STEP = sys.argv[1], int(sys.argv[2]), sys.argv[3], 4
dist.init_process_group("gloo", timeout=timedelta(seconds=900))
rank = dist.get_rank()


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if KIND == "dataset" and rank == BAD and i == STEP:
            threading.Event().wait()  # MARK-dataset
        return torch.full((3,), float(i))


model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=0)
for step, x in enumerate(profile_loop(loader, OUT, hang_timeout_s=5)):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    grad = model.weight.grad
    if step == STEP and rank == BAD and KIND != "dataset":
        if KIND == "barrier":
            dist.barrier()  # MARK-barrier
        elif KIND == "raise":
            raise ValueError("bad batch")  # MARK-raise
    else:
        dist.all_reduce(grad)
    opt.step()
dist.destroy_process_group()
'''

DEADLINE_S = 900
SEQ = 5
N, BAD = 2, 1


def _line(mark: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if f"MARK-{mark}" in text)


def _dumps_ready(out: Path) -> bool:
    for r in range(N):
        try:
            doc = json.loads((out / f"rank-{r}.hang.json").read_text())
        except (OSError, ValueError):
            return False
        if doc.get("steps_ended") is None or doc["steps_ended"] < 4:
            return False
    return True


def run(tmp_path: Path, kind: str, *, hangs: bool) -> tuple[int, Path, str]:
    """torchrun the script; a job that hangs is stopped with SIGTERM once both ranks' dumps are in."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(N),
                             str(script), kind, str(BAD), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + DEADLINE_S
    try:
        if hangs:
            while not _dumps_ready(out):
                assert proc.poll() is None, f"the job ended before it hung: {proc.stderr.read()[-3000:]}"
                assert time.monotonic() < deadline, "no dumps within the deadline"
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def hang_evidence(out: Path) -> dict:
    report = build_report(load_job(find_jobs(out)[-1]))
    hang = [f for f in report.findings if f.id == "hang"]
    assert len(hang) == 1 and hang[0].severity == "critical", [f.id for f in report.findings]
    return hang[0].evidence


def _check(ev: dict, *, missing: bool, frame: tuple[str, int]) -> None:
    assert (ev["process_group"], ev["seq"], ev["expected_op"]) == ("0", SEQ, "all_reduce[[1, 3]]")
    assert (ev["missing_ranks"], ev["mismatched_ranks"]) == (([BAD], []) if missing else ([], [BAD]))
    assert ev["stuck_ranks"] == [BAD] and ev["ranks_without_dump"] == []
    where = ev["stuck"][0]["where"]
    assert (where["function"], where["line"]) == frame and where["file"].endswith("train.py")


def test_a_rank_entering_a_barrier_under_profile_loop(tmp_path):
    code, out, err = run(tmp_path, "barrier", hangs=True)
    assert code == 1, err[-2000:]  # torchrun's status when SIGTERM stops it
    ev = hang_evidence(out)
    _check(ev, missing=False, frame=("<module>", _line("barrier")))
    assert ev["waiting_ranks"] == [0] and ev["expected_is_a_tie"] is True


def test_a_ranks_dataset_blocking_in_getitem_under_profile_loop(tmp_path):
    code, out, err = run(tmp_path, "dataset", hangs=True)
    assert code == 1, err[-2000:]
    ev = hang_evidence(out)
    _check(ev, missing=True, frame=("__getitem__", _line("dataset")))
    assert ev["waiting_ranks"] == [0]


def test_a_rank_raising_inside_the_step_under_profile_loop(tmp_path):
    code, out, err = run(tmp_path, "raise", hangs=False)
    assert code == 1, err[-2000:]  # torchrun's status for a failed worker
    ev = hang_evidence(out)
    _check(ev, missing=True, frame=("<module>", _line("raise")))
    assert BAD in ev["raised_ranks"]
    assert ev["stuck"][0]["exception"] == {"type": "ValueError", "message": "bad batch"}
