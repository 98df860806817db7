"""The open issues' speed targets (13-16) read off the committed results: which are met, how
far the others are, and what the notes say it would take. Writes benches/results/targets.md
and targets.png beside the JSON; the numbers come only from that JSON (a target whose shape
has no row there says so), the leads from benches/NOTES.md.

`python -m benches.bench --json benches/results/h200.json --report` rewrites them with its
results; by hand, from the repository root: python -m benches.targets [JSON]
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_JSON = "benches/results/h200.json"


def find(records, op, dtype, rows, n, k=None, lengths=None):
    """The one record of that shape, or None."""
    found = [
        r
        for r in records
        if (r["op"], r["dtype"], r["rows"], r["n"]) == (op, dtype, rows, n)
        and (k is None or r["k"] == k)
        and (lengths is None or r["lengths"] == lengths)
    ]
    if len(found) > 1:
        raise ValueError(f"{len(found)} records match {op} {dtype} {rows}x{n} k={k} {lengths}")
    return found[0] if found else None


def of_row(quantity, op, dtype, rows, n, k=None, lengths=None):
    """A measure: `quantity` of the one record of that shape (None without one)."""

    def measure(records):
        r = find(records, op, dtype, rows, n, k, lengths)
        return None if r is None else quantity(r)

    return measure


def time_of(*shape):
    """Our device time (us) of one shape."""
    return of_row(lambda r: r["ours_us"], *shape)


def floor_ratio(*shape):
    """Our device time over the shape's read floor."""
    return of_row(lambda r: r["ours_us"] / r["floor_us"], *shape)


def speedup_over_lax(*shape):
    """jax.lax.top_k's device time over ours, same rows."""
    return of_row(lambda r: r["lax_top_k_us"] / r["ours_us"], *shape)


def matrix_rate_share(dtype, rows, n):
    """indexer_logits' achieved TFLOP/s over the matrix rate measured in the same run."""
    return of_row(lambda r: r["tflops"] / r["matrix_TFLOPs"], "indexer_logits", dtype, rows, n)


def decode_bound_ratio(dtype, rows, n):
    """indexer_logits' time over issue 15's decode bound, 1.5 x max(compute, key read) + 4 us."""
    return of_row(
        lambda r: r["ours_us"] / (1.5 * max(r["compute_floor_us"], r["floor_us"]) + 4.0),
        "indexer_logits",
        dtype,
        rows,
        n,
    )


def worst_floor_ratio(op, dtype, k, lengths, min_rows):
    """The largest time-over-floor of every shape of that op, dtype, k and lengths with at
    least min_rows rows (each causal shape)."""

    def measure(records):
        ratios = [
            r["ours_us"] / r["floor_us"]
            for r in records
            if (r["op"], r["dtype"], r["k"], r["lengths"]) == (op, dtype, k, lengths)
            and r["rows"] >= min_rows
        ]
        return max(ratios) if ratios else None

    return measure


def topk_over_logits(dtype, rows, n):
    """indexer_topk's device time over indexer_logits' alone, same shape."""

    def measure(records):
        topk = find(records, "indexer_topk", dtype, rows, n)
        logits = find(records, "indexer_logits", dtype, rows, n)
        return None if topk is None or logits is None else topk["ours_us"] / logits["ours_us"]

    return measure


def fp8_over_bf16_throughput(min_rows):
    """The smallest bf16-time / fp8-time of indexer_logits over shapes with >= min_rows rows
    timed in both types."""

    def measure(records):
        ratios = []
        for r in records:
            if r["op"] == "indexer_logits" and r["dtype"] == "float8_e4m3fn":
                bf16 = find(records, "indexer_logits", "bfloat16", r["rows"], r["n"])
                if r["rows"] >= min_rows and bf16 is not None:
                    ratios.append(bf16["ours_us"] / r["ours_us"])
        return min(ratios) if ratios else None

    return measure


@dataclass(frozen=True)
class Target:
    issue: int
    what: str
    measure: Callable[[list], float | None]
    limit: float
    unit: str  # how the measure reads: "us", "x floor", "x lax", "x logits", "share"
    at_least: bool = False  # the measure must reach the limit (else stay at or below it)
    lead: str = ""  # for a miss: what was tried and what it would take (benches/NOTES.md)

    def verdict(self, records) -> tuple[float | None, str, float | None]:
        """(measured, "met" / "missed" / "no row", how far: measured over limit, or limit
        over measured for an at-least target, so that > 1 is short of it)."""
        value = self.measure(records)
        if value is None:
            return None, "no row", None
        gap = self.limit / value if self.at_least else value / self.limit
        return value, "met" if gap <= 1.0 else "missed", gap


QUEUE_LEAD = (
    "a queue row's serial phases (sample, select, write: ~19 us per row per block) do not "
    "overlap the next row's pass; two rows in flight per SM, warp-specialised, is unbuilt and "
    "would not reach the target alone: the selecting phases take 9.7 us per row alone on an SM "
    "and 12.9 beside another block of main, against the 9.85 per row per SM that 1.25x allows; on "
    "an H100 its streaming side (one 16-warp group per SM) takes 13.3 us per row, which bounds "
    "top_k at 558 us there against main's 695 (NOTES 'One 16-warp block per SM streaming'); "
    "cub's block sorts sync the whole block; smaller blocks lost (NOTES 'Small blocks')"
)
F32_QUEUE_LEAD = (
    "float32 causal rows draw ~3.6 TB/s with the L2 fabric ~88 % busy (NOTES 'the queue pass's "
    "reads'), so overlapping a row's serial phases would not reach 1.1x alone; on an H100 "
    "unsorted rows take 1.11x with selection and 1.09x streaming with none (NOTES 'One 16-warp "
    "block per SM streaming'), so there the pass itself is the limit; no stream-only H200 figure "
    "yet; smaller blocks lost (NOTES 'Small blocks')"
)
PREFILL_SHAPES = [(128, 65536), (512, 65536), (2048, 32768), (4096, 131072)]  # issue 15, M >= 128
FEW_ROWS_LEAD = (
    "a chain of dependent phases a row (sample, pass, merge, selection, order), each a barrier "
    "or a cluster exchange; NOTES 'topk_f32_cluster' sections list the tries that lost"
)

ZEROED_BEHIND_LOADS = (
    "; the histograms zeroed behind the row's loads took 0.11 / 0.18 us off 1 / 4 x 32768 on an "
    "H100; the H200's rows moved by 0.10 / 0.19 us between runs before and after it (NOTES 'the "
    "histograms zeroed behind the loads')"
)

VOCABULARY = 152064  # issue 13's sampling rows: [B, 152064], k = 50


def sampling_targets(dtype: str, name: str, floor_lead: str) -> list[Target]:
    """Issue 13's vocabulary rows of one dtype: >= 5x lax at every B, B = 256 <= 1.3x floor."""
    speedups = [
        Target(
            13,
            f"{name} [{b}, {VOCABULARY}] k 50, speed-up over lax",
            speedup_over_lax("top_k", dtype, b, VOCABULARY),
            5,
            "x lax",
            True,
        )
        for b in (1, 8, 64, 256)
    ]
    floor = Target(
        13,
        f"{name} [256, {VOCABULARY}] k 50, over the read floor",
        floor_ratio("top_k", dtype, 256, VOCABULARY),
        1.3,
        "x floor",
        lead=floor_lead,
    )
    return [*speedups, floor]


def latency_target(dtype: str, rows: int, n: int, k: int, limit: float, lead: str, note=""):
    """Issue 16's shapes: device time at or below `limit` us (causal where n = 430080)."""
    op = "topk_bf16" if dtype == "bfloat16" else "topk_filtered"
    lengths = "causal" if n == 430080 else "full"
    name = "bf16" if dtype == "bfloat16" else "f32"
    what = f"{name} {rows} x {n}{' causal' if lengths == 'causal' else ''} k {k}{note}"
    return Target(16, what, time_of(op, dtype, rows, n, k, lengths), limit, "us", lead=lead)


TARGETS = [
    *sampling_targets(
        "bfloat16",
        "bf16",
        "one row per block in one wave: the sample (~5 us of cold loads and histograms), the "
        "selection and the blocks' uneven ends (the last 4.6 us after the average on an H100) are "
        "exposed; on an H100 even no selection leaves 1.31x (NOTES 'Where [256, 152064]'s time "
        "outside the stamps goes'), so the sample and the tail must shrink too (not measured on "
        "the H200); k <= 64 by sorted lists took 4.6 us off on an H100 (NOTES 'Few winners'; "
        "not yet timed on the H200, ~1.6x expected); a rising cutoff in place of the sample lost "
        "(NOTES 'A rising-cutoff route'), and so did the sample's fine digit by ballots; parts "
        "of rows that early blocks take from late ones were exact but 42-43 % slower on an H100 "
        "(each part's restart and claim ~2.5 us; almost no part taken by another block; NOTES "
        "'Row parts')",
    ),
    *sampling_targets(
        "float32",
        "f32",
        "as bf16: ~9 us of sample and selection per row that nothing overlaps; k <= 64 by sorted "
        "lists took 2.3 us off on an H100 (NOTES 'Few winners'), which would put the H200's row "
        "at ~1.30x, not yet timed there",
    ),
    *[
        Target(
            13,
            f"f32 [{t}, 256] k 8, faster than lax",
            speedup_over_lax("top_k", "float32", t, 256),
            1,
            "x lax",
            True,
        )
        for t in (4096, 65536)
    ],
    Target(
        13,
        "bf16 causal 5536 x 131072 k 2048, over the 2-byte floor",
        floor_ratio("top_k", "bfloat16", 5536, 131072, 2048, "causal"),
        1.25,
        "x floor",
        lead=QUEUE_LEAD,
    ),
    Target(
        13,
        "bf16 32 x 131072 k 2048",
        time_of("top_k", "bfloat16", 32, 131072, 2048),
        20,
        "us",
        lead="32 rows split over clusters (NOTES '16-bit rows on the cluster kernel'); "
        + FEW_ROWS_LEAD,
    ),
    *[
        Target(
            14,
            f"merge_topk f32 5536 x 8 x 2048, lists {order}, over reading its input once",
            floor_ratio("merge_topk", "float32", 5536, 16384, 2048, lengths),
            1.5,
            "x floor",
            lead="bound by its work, not by HBM (the same ~420 us on an H100 and an H200): "
            "~10 us of phases a row an SM (cutoff, filter, fine placing, rank, writes); the "
            "sorted-runs merge and other branches in the register kernel lost (NOTES "
            "'merge_topk: the sorted-runs merge'); needs fewer phases a row or two rows in "
            "flight an SM: two blocks an SM took 37-46 % off rows of m <= 4096 on an H100 (NOTES "
            "'two narrow blocks an SM'), but 16384 candidates a row do not fit 64 registers "
            "a thread",
        )
        # The bench's merge rows: lists in no order ("full"), or each in rank order ("sorted"),
        # as top_k(sorted=True) returns them.
        for order, lengths in (("in no order", "full"), ("in rank order", "sorted"))
    ],
    *[
        Target(
            15,
            f"indexer_logits bf16 {m} x {n}, share of the matrix rate",
            matrix_rate_share("bfloat16", m, n),
            0.55,
            "share",
            True,
        )
        for m, n in PREFILL_SHAPES
    ],
    *[
        Target(
            15,
            f"indexer_logits bf16 {m} x 131072, over the decode bound",
            decode_bound_ratio("bfloat16", m, 131072),
            1,
            "x bound",
        )
        for m in (1, 32)
    ],
    *[
        Target(
            15,
            f"indexer_topk bf16 {m} x {n}, over indexer_logits",
            topk_over_logits("bfloat16", m, n),
            1.1,
            "x logits",
            lead="the split selection takes 33.6 us inside the op against 27.4 alone and must "
            "reach ~21.4; on an H100 the op's selection runs at the same SM clock as alone, only "
            "its loading phases slower (NOTES 'The selection inside indexer_topk, stamped'); its "
            "parts spend 7.2 us on the queue and sample at 128 x 65536, twice a block alone on an "
            "SM, and part 0 sampling alone lost (NOTES 'The split kernel's parts stamped'); the "
            "fused path's main pass costs 22-25 % over the logits kernel (NOTES 'fused "
            "indexer_topk re-timed')",
        )
        for m, n in PREFILL_SHAPES
    ],
    Target(
        15,
        "indexer_topk bf16 1 x 131072",
        time_of("indexer_topk", "bfloat16", 1, 131072),
        15,
        "us",
        lead="two kernels back to back (logits ~12 us, selection ~9 us); fusing needs a "
        "candidate sink of a few instructions a tile (NOTES 'fused indexer_topk re-timed')",
    ),
    Target(
        15,
        "indexer_topk bf16 32 x 131072",
        time_of("indexer_topk", "bfloat16", 32, 131072),
        110,
        "us",
        lead="indexer_logits alone takes ~112 us (75 % of the matrix rate): the logits "
        "kernel must get faster before any selection fits",
    ),
    Target(
        15,
        "indexer_logits fp8 throughput over bf16 at M >= 512",
        fp8_over_bf16_throughput(512),
        1.6,
        "x bf16",
        True,
        lead="native e4m3 wgmma's accumulation breaks SPEC section 9's bound (NOTES "
        "'indexer_logits fp8 on Hopper tensor cores'), so fp8 is widened to f16 and runs at "
        "bf16's matrix rate: 0.96-0.97x bf16 from 64 queries in one process (NOTES 'q and the "
        "keys widened once'; the table's rows come from two runs); what it buys is half the "
        "key cache",
    ),
    latency_target("float32", 1, 32768, 2048, 6, FEW_ROWS_LEAD + ZEROED_BEHIND_LOADS),
    latency_target("float32", 4, 32768, 2048, 6, FEW_ROWS_LEAD + ZEROED_BEHIND_LOADS),
    latency_target("float32", 1, 131072, 2048, 7, FEW_ROWS_LEAD),
    latency_target("float32", 32, 131072, 2048, 11, FEW_ROWS_LEAD),
    latency_target(
        "float32",
        43,
        430080,
        2048,
        25,
        "43 rows on 132 SMs: each row's pass split over a cluster, then its selection "
        "alone; " + FEW_ROWS_LEAD,
    ),
    latency_target(
        "bfloat16",
        1,
        16384,
        512,
        3.5,
        "one SM runs the row's ~12 K warp instructions at IPC ~1.25 (phases of 0.4-0.7 us "
        "after a 1.4 us load); loads before the length and the page table in shared "
        "memory were slower (NOTES 'topk_bf16: loads before the length'), as were walks "
        "by every warp and 1024 threads; the row over a cluster of four blocks took 0.37 us "
        "off full rows on an H100 but ~4.5 us is its floor, so shorter rows lost and it was "
        "taken out (NOTES 'topk_bf16: a row over a cluster'): 3.5 needs far fewer "
        "instructions a row",
        " (topk_bf16, page 64)",
    ),
    latency_target(
        "bfloat16",
        128,
        16384,
        512,
        4.5,
        "as 1 x 16384: latency a row, one wave; rows over clusters of 2 or 4 blocks were "
        "slower from 32 rows on (NOTES 'topk_bf16: a row over a cluster')",
        " (topk_bf16)",
    ),
    latency_target(
        "bfloat16",
        2048,
        16384,
        512,
        36,
        "instructions, not HBM (~12.2 K warp instructions a row): the next wave's rows "
        "in L2 changed nothing (NOTES 'topk_bf16: the next wave's rows in L2'), walks by "
        "every warp were 18 % slower (NOTES 'topk_bf16: walks by every warp'); IPC 2.36, "
        "barrier stalls 25 % (NOTES 'topk_bf16: loads before the length'); pass 2's two "
        "mins in one took 3.2 % off on an H100; the H200's row moved 43.3 -> 41.8 us between "
        "runs before and after it (NOTES 'pass 2's two mins')",
        " (topk_bf16)",
    ),
    Target(
        16,
        "f32 causal k 2048, worst of >= 1536 rows, over the floor",
        worst_floor_ratio("topk_filtered", "float32", 2048, "causal", 1536),
        1.1,
        "x floor",
        lead=F32_QUEUE_LEAD,
    ),
]


def _fmt(value, unit) -> str:
    if value is None:
        return "-"
    if unit == "share":
        return f"{100 * value:.0f} %"
    if unit == "us":  # two decimals below 100 us, where a tenth can decide a target
        return f"{value:,.2f}" if value < 100 else f"{value:,.1f}"
    return f"{value:.2f}"


def describe(records: list[dict]) -> str:
    """The markdown table of every target."""
    devices = sorted({r.get("device", "?") for r in records})
    dates = sorted({r.get("date", "?") for r in records})
    lines = [
        f"Results of {', '.join(devices)}, {dates[0]} to {dates[-1]}; regenerate with "
        "`python -m benches.targets` (numbers from the JSON, leads from benches/NOTES.md).",
        "",
        "| issue | target | measured | limit | status | how far (> 1: short) "
        "| what it would take |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in TARGETS:
        value, status, gap = t.verdict(records)
        sign = ">=" if t.at_least else "<="
        unit = "" if t.unit in ("us", "share") else f" {t.unit}"
        gap_text = "-" if gap is None else f"{gap:.2f}"
        lead = t.lead if status != "met" else ""
        lines.append(
            f"| {t.issue} | {t.what} | {_fmt(value, t.unit)}{unit if value is not None else ''} "
            f"| {sign} {_fmt(t.limit, t.unit)}{unit} | {status} | {gap_text} | {lead} |"
        )
    met = sum(t.verdict(records)[1] == "met" for t in TARGETS)
    lines += [
        "",
        f"{met} of {len(TARGETS)} targets met. Not listed: issue 15's 'indexer_topk never "
        "slower than indexer_logits then topk_filtered' holds by construction (that is its "
        "default path; the table's two columns are the same kernels timed twice).",
    ]
    return "\n".join(lines) + "\n"


def plot(records: list[dict], path: str) -> None:
    """A bar a target with a row, from 1 to how far it is (log scale): misses to the right of
    1 in red, met targets to the left in green, each labelled with its measure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    rows = [(t, *t.verdict(records)) for t in TARGETS]
    rows = [(t, value, gap) for t, value, _, gap in rows if gap is not None]
    fig, ax = plt.subplots(figsize=(13, 0.3 * len(rows) + 1.3))
    for y, (t, value, gap) in enumerate(rows):
        color = "tab:red" if gap > 1 else "#a6d9a6"  # light: its label sits on it
        ax.barh(y, gap - 1, left=1, color=color, height=0.7)
        unit = "" if t.unit in ("us", "share") else f" {t.unit}"
        label = f"{_fmt(value, t.unit)}{unit} (target {_fmt(t.limit, t.unit)}{unit})"
        # Misses labelled past their bar's end, met targets just left of 1 (over their bar).
        at, align = (gap * 1.08, "left") if gap > 1 else (0.92, "right")
        ax.text(at, y, label, va="center", ha=align, fontsize=7)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(0.01, 6)
    ax.set_yticks(range(len(rows)), [f"#{t.issue} {t.what}" for t, _, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "measured / target (for at-least targets, target / measured): right of 1 is short"
    )
    ax.set_title(
        "The open issues' speed targets ("
        + ", ".join(sorted({r.get("device", "?") for r in records}))
        + ")"
    )
    fig.subplots_adjust(left=0.36, right=0.98, top=0.96, bottom=0.06)  # room for the names
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(records: list[dict], json_path: str) -> None:
    """targets.md and targets.png beside the JSON."""
    out_dir = os.path.dirname(json_path)
    with open(os.path.join(out_dir, "targets.md"), "w") as f:
        f.write("# Where the speed targets stand\n\n" + describe(records))
    plot(records, os.path.join(out_dir, "targets.png"))


def main(json_path: str = DEFAULT_JSON) -> None:
    with open(json_path) as f:
        records = json.load(f)
    write(records, json_path)
    print(describe(records))


if __name__ == "__main__":
    main(*sys.argv[1:2])
