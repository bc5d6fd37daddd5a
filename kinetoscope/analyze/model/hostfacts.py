"""What the capture recorded of the host a rank ran on, read once for every analysis that sizes work to its CPUs
or judges memory against it.

The manifest is JSON data written by a training job's capture: every count here is checked to be a whole number in
its range (never a bool, a float or a string), and what was not recorded is ``None``, never a default that reads as
an answer.
"""

from __future__ import annotations

from typing import Any

from kinetoscope.analyze.model.trace import RankTrace


def count(value: Any, least: int = 1) -> int | None:
    """``value`` where it is a whole number of at least ``least`` (a manifest's count: not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= least else None


def ranks_sharing(host: dict[str, Any], world_size: int | None) -> tuple[int | None, str]:
    """(how many of the job's ranks share this rank's CPUs, what is said of it): 1 for a job of one process (a trace
    without the job's size is one: several ranks write it), or for a rank pinned to CPUs of its own (fewer than the
    host's: the launcher gave each rank its share), else the launcher's count the capture recorded; None where it did
    not."""
    ranks, cpus, on_host = count(host.get("ranks_on_host")), count(host.get("cpus")), count(host.get("cpus_on_host"))
    if world_size is None or world_size <= 1:
        return 1, ""
    if ranks is not None and ranks > 1 and cpus is not None and on_host is not None and cpus < on_host:
        return 1, (f"this rank may run on {cpus} of the host's {on_host} CPUs (pinned by its launcher): they are "
                   "taken as its own")
    if ranks is not None:
        return ranks, (f"{ranks} ranks share the host's CPUs (the launcher's count): each counts on its share"
                       if ranks > 1 else "")
    return None, "how many ranks share this host is not recorded"


def world_size(trace: RankTrace) -> int | None:
    """The job's number of ranks: the trace's own record (``distributedInfo``), else the capture's manifest."""
    return trace.meta.world_size or count((trace.meta.capture or {}).get("world_size"))


def _share(trace: RankTrace) -> tuple[int | None, int | None, int | None]:
    """(this rank's CPUs, its torch threads, the job's ranks sharing those CPUs), each None where not recorded."""
    host = (trace.meta.capture or {}).get("host") or {}
    ranks, _ = ranks_sharing(host, world_size(trace))
    return count(host.get("cpus")), count(host.get("torch_threads")), ranks


def no_core_for_a_worker(trace: RankTrace) -> bool:
    """Whether the capture recorded that this rank's share of the host's CPUs leaves none beside its torch threads
    (the job's ranks on the host, each with its threads, fill them): a DataLoader worker would take a core the
    training uses. False where the CPUs, threads or ranks sharing them are not recorded."""
    cpus, threads, ranks = _share(trace)
    if cpus is None or threads is None or ranks is None:
        return False
    return cpus / ranks - threads < 1


def job_threads(trace: RankTrace) -> tuple[int | None, bool | None]:
    """(the threads the job sizes on this rank's CPUs - each rank sharing them, its torch threads and its training
    loader's workers - and whether they fit those CPUs); (None, None) where any of them is not recorded. A loop the
    capture saw start no DataLoader worker has none; one that started workers its training loader does not account
    for (an evaluation loader's) is not known."""
    cap = trace.meta.capture or {}
    cpus, threads, ranks = _share(trace)
    workers = count((cap.get("dataloader") or {}).get("num_workers"), 0)
    loop = cap.get("loop") or {}  # the loader keeps it only as an object (``_loop_facts``)
    children = loop.get("child_processes")
    started = count(children.get("dataloader_workers"), 0) if isinstance(children, dict) else None
    if workers is None and started == 0 and "workers" in loop.get("recorded", ()):
        workers = 0  # the loop iterated no DataLoader with workers
    if workers == 0 and started:
        workers = None  # workers of a loader other than the training one ran: how many at once is not known
    if cpus is None or threads is None or ranks is None or workers is None:
        return None, None
    sized = ranks * (threads + workers)
    return sized, sized <= cpus


def host_memory_share(trace: RankTrace) -> tuple[int | None, str]:
    """(the bytes of host memory this rank may use, what is said of them): the host's memory or the process's cgroup
    limit where lower, as the capture recorded them (``host.memory_bytes``, ``host.memory_limit_bytes``), shared by
    the job's ranks on the host as the launcher counted them, each taken to grow alike (pinned to CPUs of their own or
    not: pinning does not divide memory); None, and why, where not recorded (captures before they were, traces from
    elsewhere) or where how many ranks share the host is not."""
    host = (trace.meta.capture or {}).get("host") or {}
    physical, limit = count(host.get("memory_bytes")), count(host.get("memory_limit_bytes"))
    if physical is None and limit is None:
        return None, "the host's memory is not recorded"
    total = min(v for v in (physical, limit) if v is not None)
    world = world_size(trace)
    ranks = 1 if world is None or world <= 1 else count(host.get("ranks_on_host"))
    if ranks is None:
        return None, "how many of the job's ranks share the host's memory is not recorded"
    what = "the process's memory limit" if limit is not None and (physical is None or limit < physical) \
        else "the host's memory"
    return total // ranks, what + (f", shared by {ranks} ranks growing alike" if ranks > 1 else "")
