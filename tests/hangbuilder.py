"""Hang dumps built in code, with known answers (``kinetoscope.hangdump``): a collective entry as torch's flight
recorder writes it, a rank's dump, a history of completed collectives, and a job's folder of dumps."""

from __future__ import annotations

from pathlib import Path

from kinetoscope.hangdump import Frame, HangDump, RaisedException, ThreadStack, hang_dump_name

USER = "/home/me/train.py"
LIB = "/usr/lib/python3.11/threading.py"


def entry(seq: int, op: str = "all_reduce", sizes=((4, 3),), dtype: str = "Float", done: bool = True,
          group: tuple[str, str] = ("0", "default_pg")) -> dict:
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "profiling_name": f"gloo:{op}",
            "process_group": list(group), "pg_id": int(group[0]) if group[0].isdigit() else 9,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
            "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype] * len(sizes),
            "state": "scheduled", "retired": done, "time_created_ns": 1000 + seq}


def dump(rank: int, entries: list[dict], *, world: int = 4, frames: list[Frame] | None = None,
         reason: str = "watchdog", exc: RaisedException | None = None, pg_config: dict | None = None) -> HangDump:
    frames = frames if frames is not None else [Frame(file=LIB, line=320, function="wait"),
                                                 Frame(file=USER, line=40 + rank, function="step")]
    return HangDump(rank=rank, world_size=world, pid=100 + rank, reason=reason, written_unix_ns=1, steps_ended=7,
                    seconds_since_progress=9.0, threads=[ThreadStack(ident=1, name="MainThread", training=True,
                                                                     frames=frames)],
                    exception=exc,
                    flight_recorder={"entries": entries, "pg_config": pg_config or {}, "version": "2.10"})


def history(n: int, **last) -> list[dict]:
    """Collectives #1..#n completed, then #n+1 as ``last`` says (not completed), if given."""
    out = [entry(s) for s in range(1, n + 1)]
    if last:
        out.append(entry(n + 1, done=False, **last))
    return out


def write_dumps(directory: Path, dumps) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for d in dumps:
        (directory / hang_dump_name(d.rank)).write_bytes(d.to_json())
    return directory
