"""Issue 31 item 3: communication by what it serves, on traces built so each collective's role, its exposed time and
what hiding it is worth are known by construction (each test's comments work them out)."""

from __future__ import annotations

from conftest import load_built
from tracebuilder import MAIN_PID, NCCL, TraceBuilder, ddp_step

from kinetoscope.analyze.model.commroles import collective_roles
from kinetoscope.analyze.whatif.commroles import comm_roles_entry

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]
WORKER = 200  # a gloo worker thread


def test_ddp_s_gradient_all_reduce_in_backward_its_exposed_time_and_its_worth(tmp_path):
    r = load_built(tmp_path, ddp_step()).ranks[0]
    roles = collective_roles(r)
    assert list(roles["role"]) == ["dp_allreduce"] * 3 and list(roles["phase"]) == ["backward"] * 3
    e = comm_roles_entry(r)
    (dp,) = e.roles
    assert e.where == "gpu" and e.exposed_unknown is None and e.fsdp is None
    assert (dp.role, dp.collectives, dp.ops, dp.time_us, dp.exposed_us) == \
        ("dp_allreduce", 3, ["allreduce"], 900.0, 900.0)
    # hidden entirely, the all-reduce ends at +620; the sync then costs its own 5 us from +700 and returns at +705,
    # the 75 us of host work after it end the step at +780: 220 us per step, not the 300 us exposed
    assert dp.worth_us_per_step == 220.0


def test_the_report_holds_the_block_typed_and_the_roles_table_reads_it(tmp_path):
    from kinetoscope.analyze.model.results import CommRoles
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.analyze.views.distributed import roles_table

    report = build_report(load_built(tmp_path, ddp_step()))
    block = report.rank_reports[0].result(CommRoles)
    assert block is not None and report.ranks[0]["comm_roles"] == block.to_dict()
    # 900 us of all-reduce over 3 steps, none of it hidden, worth 220 us a step (the test above): ms per step
    row = roles_table(report).iloc[0]
    assert (row["rank"], row["role"], row["collectives"]) == (0, "dp_allreduce", 3)
    assert (row["time_ms"], row["exposed_ms"], row["worth_ms"]) == (0.3, 0.3, 0.22)


def tp_forward() -> TraceBuilder:
    """An all-reduce launched inside the forward (before the step's backward): tensor parallelism."""
    b = TraceBuilder(device_properties=A100)
    t = 10_000
    b.step(0, t, 1000)
    b.op("aten::linear", t + 10, 290)
    b.kernel(t + 30, 100, name="fwd_gemm", launch_at=t + 20)
    b.kernel(t + 140, 50, name=NCCL, stream=20, launch_at=t + 100)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t + 400, 300)
    b.kernel(t + 410, 200, name="bwd_gemm", launch_at=t + 405)
    return b


def test_an_all_reduce_issued_in_the_forward_serves_tensor_parallelism(tmp_path):
    r = load_built(tmp_path, tp_forward()).ranks[0]
    roles = collective_roles(r)
    assert list(roles["role"]) == ["tp_forward"] and list(roles["phase"]) == ["forward"]


def fsdp_on_gloo(steps: int = 2) -> TraceBuilder:
    """Each 1000 us step on the CPU: FSDP issues two all-gathers at once (+10, +20, prefetching), which a gloo worker
    runs one after the other (+30..+130, +130..+230); compute +150..+200; in backward, a reduce-scatter issued at +610
    that gloo runs as an all-reduce (+620..+700) beside compute (+600..+650: the backward node's ``aten::mm`` around
    the call; the node itself holds the call, a container, not compute)."""
    b = TraceBuilder()
    b.raw({"ph": "M", "name": "thread_name", "pid": MAIN_PID, "tid": WORKER, "args": {"name": "gloo"}})
    for k in range(steps):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.op("FSDP::all_gather (layers.0)", t + 5, 30, cat="user_annotation")
        b.op("c10d::_allgather_base_", t + 10, 5)
        b.op("c10d::_allgather_base_", t + 20, 5)
        b.op("gloo:all_gather", t + 30, 100, tid=WORKER)
        b.op("gloo:all_gather", t + 130, 100, tid=WORKER)
        b.op("aten::mm", t + 150, 50)
        b.op("autograd::engine::evaluate_function: MmBackward0", t + 600, 50)
        b.op("aten::mm", t + 600, 5)
        b.op("FSDP::post_backward_reduce", t + 605, 10, cat="user_annotation")
        b.op("c10d::_reduce_scatter_base_", t + 610, 5)
        b.op("aten::mm", t + 615, 35)
        b.op("gloo:all_reduce", t + 620, 80, tid=WORKER)
    return b


def test_fsdp_on_gloo_all_gathers_in_flight_and_queued_and_the_reduce_scatter_gloo_runs_as_an_all_reduce(tmp_path):
    r = load_built(tmp_path, fsdp_on_gloo()).ranks[0]
    roles = collective_roles(r)
    assert list(roles["role"]) == ["fsdp_allgather", "fsdp_allgather", "fsdp_reducescatter"] * 2
    assert list(roles["op"]) == ["allgather", "allgather", "reducescatter"] * 2
    e = comm_roles_entry(r)
    assert e.where == "host" and e.worth_of is None
    by = {x.role: x for x in e.roles}
    # all-gathers: +30..+230 less the compute at +150..+200: 150 us a step; the reduce-scatter +620..+700 less
    # +620..+650: 50 us a step
    assert by["fsdp_allgather"].exposed_us == 300.0 and by["fsdp_allgather"].time_us == 400.0
    assert by["fsdp_reducescatter"].exposed_us == 100.0 and by["fsdp_reducescatter"].time_us == 160.0
    assert by["fsdp_allgather"].worth_us_per_step is None  # the replay holds no host collectives
    # two issued at once (+10 and +20, the first ending at +130): two in flight; the second waited behind the first
    # from its issue (+20) to its start (+130)
    # the JSON object, its keys in the report's order
    assert list(e.to_dict()) == ["where", "fraction_of", "roles", "exposed_unknown", "worth_of", "fsdp", "pipeline"]
    assert e.to_dict()["fsdp"] == {"allgathers": 4, "issue_recorded": 4, "max_in_flight": 2,
                                   "queued_behind_previous": 2, "queued_us": 220.0}


GENERIC = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"  # RCCL: the name says no operation
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def generic_kernels() -> TraceBuilder:
    """One 1000 us step whose collective kernels' names do not say their operation: in the forward (+10..+200), a
    SendRecv kernel launched inside record_param_comms("all_to_all"); in backward (+300..+600), a generic kernel
    launched inside c10d::allreduce_ > nccl:all_reduce (record_param_comms without a name); in the optimizer
    (+700..+900), a generic kernel inside c10d::_allgather_base_ > record_param_comms("all_gather_into_tensor"); then
    a generic kernel launched outside any host op naming it, and an all-reduce kernel (its name says so) launched
    inside a host all-to-all: the kernel's name wins."""
    b = TraceBuilder(device_properties=A100)
    t = 10_000
    b.step(0, t, 1000)
    b.op("aten::linear", t + 10, 190)
    b.kernel(t + 30, 50, name="fwd_gemm", launch_at=t + 20)
    b.op("record_param_comms", t + 100, 20, **{"Collective name": "all_to_all"})
    b.kernel(t + 130, 40, name=SENDRECV, stream=20, launch_at=t + 105)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t + 300, 300)
    b.op("c10d::allreduce_", t + 400, 40)
    b.op("record_param_comms", t + 405, 30)
    b.op("nccl:all_reduce", t + 410, 20, cat="user_annotation")
    b.kernel(t + 450, 100, name=GENERIC, stream=20, launch_at=t + 415)
    b.op("Optimizer.step#SGD.step", t + 700, 200, cat="user_annotation")
    b.op("c10d::_allgather_base_", t + 710, 40)
    b.op("record_param_comms", t + 715, 30, **{"Collective name": "_allgather_base"})
    b.kernel(t + 760, 60, name=GENERIC, stream=20, launch_at=t + 720)
    b.kernel(t + 830, 10, name=GENERIC, stream=20, launch_at=t + 800)
    b.op("nccl:all_to_all", t + 850, 20, cat="user_annotation")
    b.kernel(t + 880, 10, name=NCCL, stream=20, launch_at=t + 855)
    return b


def test_a_kernel_naming_no_operation_takes_it_from_the_host_op_that_launched_it(tmp_path):
    r = load_built(tmp_path, generic_kernels()).ranks[0]
    roles = collective_roles(r)
    assert list(roles["op"]) == ["alltoall", "allreduce", "allgather", "other", "allreduce"]
    assert list(roles["phase"]) == ["forward", "backward", "optimizer", "optimizer", "optimizer"]
    # an all-gather in the optimizer is no FSDP parameter gather (no FSDP annotation): other, as the doc says
    assert list(roles["role"]) == ["alltoall", "dp_allreduce", "other", "other", "other"]


def test_without_a_launch_on_record_a_generic_kernel_s_operation_stays_unknown(tmp_path):
    b = TraceBuilder(device_properties=A100)
    b.step(0, 10_000, 1000)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10_300, 300)
    b.op("nccl:all_reduce", 10_400, 20, cat="user_annotation")
    b.kernel(10_450, 100, name=GENERIC, stream=20)  # launched before the recording began
    roles = collective_roles(load_built(tmp_path, b).ranks[0])
    assert list(roles["op"]) == ["other"] and list(roles["role"]) == ["other"]


def rccl_step() -> TraceBuilder:
    """One 1000 us step on an MI300X whose collectives all run in RCCL's ``ncclDevKernel_Generic_4`` kernel (its name
    says no operation), as the TraceLens MI300X trace records them: in the forward (+10..+200) a broadcast whose kernel
    carries its own "Collective name" and group (Kineto copies the launching op's args onto the kernel); in backward
    (+300..+700) a kernel launched by hipExtLaunchKernel inside record_param_comms("allreduce") without args of its
    own; and one kernel launched before the recording began: no launch, no args, nothing names it."""
    b = TraceBuilder(device_properties=[{"id": 0, "name": "AMD Instinct MI300X"}])
    t = 10_000
    b.step(0, t, 1000)
    b.kernel(t + 2, 30, name="ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", stream=4)
    b.op("aten::linear", t + 10, 190)
    b.kernel(t + 40, 50, name="Cijk_Alik_Bljk_BBS_BH", launch_at=t + 20)
    b.kernel(t + 100, 14, name="ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", stream=4,
             launch_at=t + 60, args={"Collective name": "broadcast", "In msg nelems": 9600,
                                     "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"})
    b.op("autograd::engine::evaluate_function: ConvolutionBackward0", t + 300, 400)
    b.op("c10d::allreduce_", t + 400, 60)
    b.op("record_param_comms", t + 405, 50, **{"Collective name": "allreduce", "In msg nelems": 2873320})
    b.op("nccl:all_reduce", t + 410, 40, cat="user_annotation")
    b.kernel(t + 460, 300, name="ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", stream=4,
             launch_at=t + 420)
    return b


def test_rccl_s_generic_kernels_take_their_operation_from_their_args_or_launch_and_the_rest_is_unknown(tmp_path):
    r = load_built(tmp_path, rccl_step()).ranks[0]
    roles = collective_roles(r)
    assert list(roles["op"]) == ["other", "broadcast", "allreduce"]
    assert list(roles["role"]) == ["other", "other", "dp_allreduce"]
    assert list(roles["group_ranks"])[1] == "[0, 1, 2, 3, 4, 5, 6, 7]"
    by = {x.role: x for x in comm_roles_entry(r).roles}
    # the unnamed kernel is counted under other, said as unknown
    assert (by["other"].collectives, by["other"].ops, by["other"].ops_unknown) == (2, ["broadcast", "unknown"], 1)
    assert (by["dp_allreduce"].ops, by["dp_allreduce"].ops_unknown) == (["allreduce"], 0)
