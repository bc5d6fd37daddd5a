"""Distributed: per rank computation / communication / overlap / wait, the rank waited for, clock skew, and
the matched collectives (all computed in analyze.distview)."""

import altair as alt
import pandas as pd

from kinetoscope.analyze.views.distributed import distributed_view
from kinetoscope.app import state
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import listing, missing_ranks_text, rank_ranges

#: the four parts of a step on the GPU, and the wait, in fixed colours (the same on every job)
PARTS = {
    "compute_only_ms": ("computation only", "#4c78a8"),
    "overlap_ms": ("computation overlapped with communication", "#72b7b2"),
    "communication_only_ms": ("communication only", "#f58518"),
    "other_ms": ("neither (GPU idle or other work)", "#bab0ac"),
}
LABELS = {
    "rank": "rank",
    "steps": "steps",
    "step_ms": "mean step (ms)",
    "compute_only_ms": "computation only (ms/step)",
    "overlap_ms": "overlapped (ms/step)",
    "communication_only_ms": "communication only (ms/step)",
    "other_ms": "neither (ms/step)",
    "collective_wait_ms": "collective wait (ms/step)",
    "waited_for_rank": "waited for rank",
    "last_to_arrive": "last to arrive (collectives)",
    "others_wait_ms": "others' wait for it (ms/step)",
    "clock_skew_ms": "clock skew (ms)",
    "straggler": "straggler",
}


ROLE_LABELS = {"rank": "rank", "serves": "serves", "collectives": "collectives",
               "ops_unknown": "operation unknown", "time_ms": "time (ms/step)",
               "exposed_ms": "exposed (ms/step)", "worth_ms": "worth hiding (ms/step)",
               "fsdp_max_in_flight": "all-gathers in flight", "fsdp_queued": "queued all-gathers"}


def render() -> None:
    analysis = state.current()
    view = distributed_view(analysis.trace, analysis.report)
    st.title("Distributed")
    h = view.headline
    if h["ranks"] < 2:
        st.info("A single rank: load a directory (or upload several files as the ranks of one job) to see how the "
                "ranks wait for each other.")
    missing = missing_ranks_text({"missing_ranks": h["missing_ranks"], "world_size": h["world_size"]})
    if missing:
        st.warning(md("{}.", missing[0].upper() + missing[1:]))
    cols = st.columns(4)
    if missing:
        cols[0].metric(
            "Straggler", "not judged", help=md("{} of the job's ranks have no file", len(h["missing_ranks"]))
        )
    else:
        cols[0].metric("Straggler", "none found" if h["straggler_rank"] is None else f"rank {h['straggler_rank']}",
                       help=md("the rank the others wait for at most collectives, with its cause{}",
                               f": {h['straggler_cause']}" if h["straggler_cause"] else ""))
    cols[1].metric("Most waited for" + (f" (of the {h['ranks']} given)" if missing else ""),
                   "n/a" if h["most_waited_for_rank"] is None else f"rank {h['most_waited_for_rank']}",
                   help="the rank that arrived last at the most matched collectives")
    cols[2].metric(
        "Longest collective wait",
        "n/a" if h["wait_ms_per_step_max"] is None else f"{h['wait_ms_per_step_max']:,.3f} ms/step",
        help="the most any rank waited per step for the last to arrive"
        + ("" if h["wait_ms_per_step_min"] is None else f"; the least: {h['wait_ms_per_step_min']:,.3f} ms/step"),
    )
    cols[3].metric(
        "Largest clock skew",
        "n/a" if h["max_abs_clock_skew_ms"] is None else f"{h['max_abs_clock_skew_ms']:,.3f} ms",
        help="ranks' clocks aligned on collective completion before arrivals are compared",
    )
    if h["matched_collectives"] is not None:
        st.caption(f"{h['matched_collectives']:,} collectives matched across ranks, {h['unmatched_collectives']:,} "
                   "unmatched (missing on some rank, or point-to-point).")
    ranks = view.ranks
    if ranks[list(PARTS)].notna().any().any():
        long = ranks.melt(id_vars=["rank"], value_vars=list(PARTS), var_name="part", value_name="ms").dropna()
        long["part"] = long["part"].map(lambda p: PARTS[p][0])
        st.subheader("Where each rank's step goes on the GPU")
        chart = alt.Chart(long).mark_bar().encode(
            y=alt.Y("rank:O", title="rank"), x=alt.X("ms:Q", title="ms per step"),
            color=alt.Color("part:N", title=None, scale=alt.Scale(domain=[v[0] for v in PARTS.values()],
                                                                  range=[v[1] for v in PARTS.values()]),
                            legend=alt.Legend(orient="bottom", labelLimit=400, columns=2)),
            order=alt.Order("part_order:Q"),
            tooltip=["rank", "part", alt.Tooltip("ms:Q", format=",.3f")],
        ).transform_calculate(part_order="indexof(" + str([v[0] for v in PARTS.values()]) + ", datum.part)")
        st.altair_chart(
            chart.properties(height=30 * len(ranks) + 140),
            width="stretch",
            description="ms per step on the "
            "GPU by rank: "
            + "; ".join(
                f"rank {r}: " + listing(zip(g["part"], g["ms"], strict=False))
                for r, g in list(long.groupby("rank", sort=True))[:16]
            ),
        )
        unjudged = ranks.loc[ranks["compute_only_ms"].notna() & ranks["other_ms"].isna(), "rank"].tolist()
        if unjudged:
            st.caption(md("{} {}: the trace misses part of the GPU's activity, so the time the kernels do not cover "
                          "is not judged idle (left out of the chart).", "Ranks" if len(unjudged) > 1 else "Rank",
                          rank_ranges(unjudged)))
    if ranks["collective_wait_ms"].notna().any():
        st.subheader("Collective wait per rank")
        wait = alt.Chart(ranks).mark_bar(color="#e45756").encode(
            y=alt.Y("rank:O"), x=alt.X("collective_wait_ms:Q", title="ms per step waiting for the last rank"),
            tooltip=["rank", alt.Tooltip("collective_wait_ms:Q", format=",.3f"), "waited_for_rank"])
        st.altair_chart(
            wait.properties(height=30 * len(ranks) + 90),
            width="stretch",
            description="ms per step each rank waited in collectives for the last rank: "
            + listing(
                (f"rank {r}", v) for r, v in zip(ranks["rank"], ranks["collective_wait_ms"], strict=False) if v == v
            ),
        )
    st.subheader("Ranks")
    st.caption(view.about)
    shown = ranks.rename(columns=LABELS)  # blank where the trace cannot say
    st.dataframe(shown, formats={LABELS[c]: "{:,.3f}" for c in RANK_COLUMNS_MS}, highlight=shown["straggler"],
                 width="stretch")
    st.subheader("Collectives")
    coll = view.collectives
    if coll.empty:
        st.caption("No collectives matched across ranks.")
    else:
        _matched(coll)
    _roles(view.roles)
    _stages(view.stages)


def _roles(roles: pd.DataFrame) -> None:
    if roles.empty:
        return
    st.subheader("Communication by what it serves")
    st.caption("Per rank and role, ms per step: the collectives' time, the part no compute ran beside "
               "(exposed), and what hiding them entirely would give the step (the replay; blank for collectives "
               "on the host). Operation unknown: collectives the trace does not name (a generic kernel launched "
               "before the recording began), counted under other. FSDP: all-gathers in flight at once (1: no "
               "prefetch) and queued behind the previous one on one communicator.")
    st.dataframe(roles.drop(columns=["role"]).rename(columns=ROLE_LABELS),
                 formats={ROLE_LABELS[c]: "{:,.3f}" for c in ("time_ms", "exposed_ms", "worth_ms")},
                 width="stretch")


STAGE_LABELS = {"stage": "stage", "rank": "rank", "upstream_rank": "receives from rank",
                "downstream_rank": "sends to rank", "steps": "steps", "step_ms": "mean step (ms)",
                "bubble_ms": "bubble (ms/step)", "bubble_fraction": "bubble (share of the step)",
                "worth_ms": "worth removing the waits (ms/step)", "where": "measured on"}


def _stages(stages: pd.DataFrame) -> None:
    if stages.empty:
        return
    st.subheader("Pipeline stages")
    st.caption("Per stage, each complete step: the bubble, the time the stage waited for a neighbour's activations "
               "or gradients (on the GPU: a send or receive kernel running and no compute kernel; on the host: the "
               "training thread in send/receive beside no compute), and what the stage gains if its neighbours never "
               "kept it waiting (the replay; an upper bound on what a schedule with fewer bubbles gives it; blank "
               "for send/receive on the host). Stage order: who receives from whom; blank where the trace cannot "
               "say.")
    st.dataframe(stages.rename(columns=STAGE_LABELS),
                 formats={STAGE_LABELS["step_ms"]: "{:,.3f}", STAGE_LABELS["bubble_ms"]: "{:,.3f}",
                          STAGE_LABELS["bubble_fraction"]: "{:.1%}", STAGE_LABELS["worth_ms"]: "{:,.3f}"},
                 width="stretch")


def _matched(coll: pd.DataFrame) -> None:
    st.caption(f"{len(coll):,} matched collectives, longest wait first (the first 200 shown): the rank the others "
               "waited for, the longest wait, and the transfer time (the shortest duration among the ranks).")
    top = coll.sort_values("max_wait_ms", ascending=False, kind="stable").head(200)
    st.dataframe(top.rename(columns={"max_wait_ms": "longest wait (ms)", "transfer_ms": "transfer (ms)",
                                     "waited_for_rank": "waited for rank"}),
                 formats={"longest wait (ms)": "{:,.3f}", "transfer (ms)": "{:,.3f}"}, width="stretch")


RANK_COLUMNS_MS = ("step_ms", "compute_only_ms", "overlap_ms", "communication_only_ms", "other_ms",
                   "collective_wait_ms", "others_wait_ms", "clock_skew_ms")
