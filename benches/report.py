"""The results file and what people read of it: merge records into the JSON, write the
Markdown table and the PNG plot beside it.

    python -m benches.report benches/results/h200.json     (the .md and .png from the JSON)

A record is one (op, dtype, rows, n, k, lengths, page_size): `record_key`. `merge` replaces
the file's records of the shapes measured now and keeps the others, so a partial rerun
(`python -m benches.bench --ops top_k --json ... --merge`) updates a results file in place.
"""

from __future__ import annotations

import json
import os
import sys

# Records written before `dtype` was a key: each operator then had one score dtype.
_DTYPE_BEFORE_THE_KEY = {"topk_bf16": "bfloat16", "topk_filtered": "float32"}
FULL_RUN = "python -m benches.bench --json {path} --report"


def record_key(record: dict) -> tuple:
    return (
        record["op"],
        record["dtype"],
        record["rows"],
        record["n"],
        record["k"],
        record["lengths"],
        record.get("page_size", 1),
    )


def load(path: str) -> list[dict]:
    with open(path) as f:
        records = json.load(f)
    for record in records:
        record.setdefault("dtype", _DTYPE_BEFORE_THE_KEY.get(record["op"]))
    return records


def load_cub(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)


def merge(old: list[dict], new: list[dict], order: list[tuple]) -> list[dict]:
    """`old` with the records of `new`'s shapes replaced and `new`'s other records added,
    in the grid's `order` (keys not in it last). Refuses to mix devices."""
    devices = {r.get("device") for r in old} | {r.get("device") for r in new}
    if len(devices) > 1:
        raise SystemExit(f"--merge: the file and this run are on different devices {devices}")
    by_key = {record_key(r): r for r in old}
    by_key.update({record_key(r): r for r in new})
    position = {key: i for i, key in enumerate(order)}
    return sorted(by_key.values(), key=lambda r: position.get(record_key(r), len(position)))


def save(records: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _fmt_rate(value) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def checked(record: dict) -> bool:
    """Every peer selected the same set, and (top_k) our values are the operand's."""
    return bool(record.get("same_set_as_peers")) and record.get("values_at_indices") is not False


def is_indexer(record: dict) -> bool:
    return record["op"] in ("indexer_logits", "indexer_topk")


def format_table(records: list[dict]) -> str:
    """The top-k operators' table, then the indexer's section where there are its records."""
    tables = []
    top_k_records = [r for r in records if not is_indexer(r)]
    if top_k_records:
        tables.append(_top_k_table(top_k_records))
    indexer_records = [r for r in records if is_indexer(r)]
    if indexer_records:
        tables.append(_indexer_section(indexer_records))
    return "\n\n".join(tables)


def _top_k_table(records: list[dict]) -> str:
    header = (
        "| op | dtype | rows | n | k | lengths | ours (us) | ours wall (us) | lax.top_k (us) | "
        "torch.topk (us) | floor (us) | ours/floor | speed-up vs lax | checked |"
    )
    lines = [header, "|" + " --- |" * 14]
    for r in records:
        ratio = r["ours_us"] / r["floor_us"] if r.get("floor_us") else None
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['rows']} | {r['n']} | {r['k']} | {r['lengths']} | "
            f"{_fmt(r['ours_us'])} | {_fmt(r['ours_wall_us'])} | {_fmt(r['lax_top_k_us'])} | "
            f"{_fmt(r['torch_topk_us'])} | {_fmt(r['floor_us'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{r['lax_top_k_us'] / r['ours_us']:.1f}x | "
            f"{'yes' if checked(r) else 'NO'} |"
        )
    return "\n".join(lines)


def _indexer_section(records: list[dict]) -> str:
    header = (
        "| op | dtype | M | N | H | D | k | lengths | ours (us) | ours wall (us) | "
        "JAX path (us) | JAX scores + topk_filtered (us) | our logits + topk_filtered (us) | "
        "compute floor (us) | memory floor (us) | TFLOP/s | of matrix rate | "
        "speed-up vs JAX path | same as JAX path | checked |"
    )
    lines = [header, "|" + " --- |" * 20]
    for r in records:
        of_rate = r["tflops"] / r["matrix_TFLOPs"] if r.get("matrix_TFLOPs") else None
        overlap = r.get("jax_path_overlap")
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['rows']} | {r['n']} | {r['heads']} | "
            f"{r['head_dim']} | {r['k']} | {r['lengths']} | {_fmt(r['ours_us'])} | "
            f"{_fmt(r['ours_wall_us'])} | {_fmt(r['jax_path_us'])} | "
            f"{_fmt(r.get('jax_path_filtered_us'))} | {_fmt(r.get('logits_then_filtered_us'))} | "
            f"{_fmt(r.get('compute_floor_us'))} | {_fmt(r.get('floor_us'))} | "
            f"{_fmt_rate(r['tflops'])} | {'-' if of_rate is None else f'{of_rate:.0%}'} | "
            f"{r['jax_path_us'] / r['ours_us']:.1f}x | "
            f"{'-' if overlap is None else f'{overlap:.2%}'} | "
            f"{'yes' if r.get('matches_contract') else 'NO'} |"
        )
    return (
        "### The lightning indexer (SPEC section 9)\n\n"
        "q [M, H, D] and keys [N, D] in the dtype named (fp8 keys with one float32 scale a "
        "key), float32 weights [M, H]; M consecutive queries of one sequence, query t seeing "
        "N - M + t + 1 keys ('causal'). 'JAX path': what a JAX user writes today, "
        "einsum('mhd,nd->mhn') to float32 products, relu, the weighted sum over the heads, "
        "-inf past the lengths (over chunks of rows where [M, H, N] passes 8 GB), followed by "
        "jax.lax.top_k for indexer_topk; the next two columns replace that top-k by "
        "topk_filtered, or the JAX scores by our indexer_logits. Compute floor: 2 H D FLOPs "
        "a visible pair at the matrix rate of an 8192^3 matmul of the rows' dtype measured in "
        "the same run; memory floor: the inputs read and the output written once at the "
        "copy bandwidth; TFLOP/s: ours over the visible pairs. 'same as JAX path': the share "
        "of our positions that the JAX path with topk_filtered selects too (rounding may "
        "reorder near-equal logits). 'checked': indexer_topk equals "
        "topk_filtered(indexer_logits) bit for bit and the JAX path's two top-ks agree; for "
        "indexer_logits, within twice SPEC section 9's bound of a float32 reference (first "
        "and last 8 rows).\n\n" + "\n".join(lines)
    )


def cub_path(json_path: str) -> str:
    """Where benches/probes/cub_batched_topk.sh's records for this results file lie."""
    return os.path.splitext(json_path)[0] + "_cub.json"


def cub_section(records: list[dict], cub_records: list[dict]) -> str:
    """CUB's top-k (benches/probes/cub_batched_topk.cu) beside ours on the same shapes."""
    ours = {}
    for r in records:
        if r["op"] in ("topk_filtered", "topk_bf16"):
            ours.setdefault((r["dtype"], r["rows"], r["n"], r["k"], r["lengths"]), r)
    lines = [
        "| dtype | rows | n | k | lengths | ours (us) | CUB (us) | CUB's call | CUB / ours | "
        "CUB's keys checked |",
        "|" + " --- |" * 10,
    ]
    for c in cub_records:
        mine = ours.get((c["dtype"], c["rows"], c["n"], c["k"], c["lengths"]))
        ratio = f"{c['median_us'] / mine['ours_us']:.2f}" if mine else "-"
        lines.append(
            f"| {c['dtype']} | {c['rows']} | {c['n']} | {c['k']} | {c['lengths']} | "
            f"{_fmt(mine['ours_us'] if mine else None)} | {_fmt(c['median_us'])} | "
            f"{c['peer']} | {ratio} | {'yes' if c['keys_checked'] else 'NO'} |"
        )
    return (
        "### CUB's top-k on the latency shapes (issue 16)\n\n"
        "CCCL 3.5 (the nvidia-cuda-cccl wheel) on random normal rows of the same shapes: "
        "cub::DeviceBatchedTopK where a row fits one block (n <= 8192), else cub::DeviceTopK "
        "once a row (the rows over up to 32 parallel streams in the graph); both only "
        "offer unsorted output with unspecified ties, a weaker "
        "contract than ours. CUB's time is a CUDA graph of the call replayed between CUDA "
        "events (the median of 15 batches of 20); ours is the table's device time (bf16 rows "
        "are topk_bf16's, page size 64). 'keys checked': CUB's selected keys are each row's "
        "k largest.\n\n" + "\n".join(lines)
    )


def _describe(records: list[dict]) -> str:
    first = records[0] if records else {}
    dates = sorted({r["date"] for r in records})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return (
        f"Device: {first.get('device', '?')}; jax {first.get('jax', '?')}; {when}. Times are "
        "device time per call in microseconds (sum of kernel durations from JAX's "
        "profiler, median over calls on distinct inputs), except 'ours wall', the "
        "latency a JAX user sees. lax.top_k runs on rows masked to -inf past their "
        "lengths (mask included; no mask for top_k rows without lengths); torch.topk on the "
        "same rows (CUDA events). Floor = valid bytes (2 an element for 16-bit rows) / "
        "measured copy bandwidth. 'checked': every peer selected the same set (and top_k's "
        "values are the operand at its indices). Scores: random normal, float32 draws "
        "rounded to the row's dtype (before 2026-12-04 16-bit rows were drawn in 16 bits: "
        "128 distinct values). merge_topk rows hold "
        "n / k candidate lists of k (a value and an int32 global column each, as column "
        "shards' top_k results arrive); its peers run lax.top_k / torch.topk over the "
        "candidates and gather the columns, its floor reads every value and column once, and "
        "'checked' means the three selected the same values.\n\n"
    )


PEERS = (  # (record key, colour, line style, name): a colour a peer, a marker a line
    ("ours_us", "tab:blue", "-", "ours"),
    ("lax_top_k_us", "tab:orange", "--", "lax.top_k"),
    ("torch_topk_us", "tab:green", ":", "torch.topk"),
    ("floor_us", "tab:gray", "-.", "HBM floor"),
)
INDEXER_PEERS = (
    ("ours_us", "tab:blue", "-", "ours"),
    ("jax_path_us", "tab:orange", "--", "JAX path"),
    ("jax_path_filtered_us", "tab:green", ":", "JAX scores + topk_filtered"),
    ("logits_then_filtered_us", "tab:purple", (0, (3, 1, 1, 1)), "our logits + topk_filtered"),
    ("compute_floor_us", "tab:gray", "-.", "compute floor"),
)
# A panel: (title, which records, x axis, the text of the line a record is on, the peers
# drawn). The x axis is a record key (log scale) or "shape" (one category per rows x n, by
# total size).
PANELS = (
    (
        "topk_bf16 (k, lengths)",
        lambda r: r["op"] == "topk_bf16",
        "rows",
        lambda r: f"k={r['k']} {r['lengths']}",
    ),
    (
        "topk_filtered causal chunks (k)",
        lambda r: r["op"] == "topk_filtered" and r["lengths"] == "causal",
        "shape",
        lambda r: f"k={r['k']}",
    ),
    (
        "topk_filtered decode (rows)",
        lambda r: r["op"] == "topk_filtered" and r["lengths"] != "causal",
        "n",
        lambda r: f"rows={r['rows']}",
    ),
    (
        "top_k vocabulary [B, 152064], k=50",
        lambda r: r["op"] == "top_k" and r["n"] == 152064,
        "rows",
        lambda r: r["dtype"],
    ),
    (
        "top_k MoE routing [T, 256], k=8",
        lambda r: r["op"] == "top_k" and r["n"] == 256,
        "rows",
        lambda r: r["dtype"],
    ),
    (
        "top_k long rows (dtype, k, lengths)",
        lambda r: r["op"] == "top_k" and r["n"] not in (152064, 256),
        "shape",
        lambda r: f"{r['dtype']} k={r['k']} {r['lengths']}",
    ),
    (
        "merge_topk (dtype; n / k lists of k)",
        lambda r: r["op"] == "merge_topk",
        "rows",
        lambda r: f"{r['dtype']} {r['n'] // r['k']} x {r['k']}",
    ),
    *(
        (
            f"{op} causal chunks (dtype)",
            lambda r, op=op: r["op"] == op,
            "shape",
            lambda r: r["dtype"],
            INDEXER_PEERS,
        )
        for op in ("indexer_logits", "indexer_topk")
    ),
)
MARKERS = "osD^vx*P"


def _plot_panel(ax, title, group, xkey, line_of, peers=PEERS) -> None:
    from matplotlib.ticker import NullFormatter

    shapes = sorted({(r["rows"], r["n"]) for r in group}, key=lambda s: s[0] * s[1])
    for marker, line in zip(MARKERS * 4, sorted({line_of(r) for r in group})):
        on_line = [r for r in group if line_of(r) == line]
        if xkey == "shape":
            points = sorted(on_line, key=lambda r: shapes.index((r["rows"], r["n"])))
            xs = [shapes.index((r["rows"], r["n"])) for r in points]
        else:
            points = sorted(on_line, key=lambda r: r[xkey])
            xs = [r[xkey] for r in points]
        for key, colour, style, name in peers:
            ys = [r.get(key) for r in points]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, marker=marker, color=colour, ls=style, label=f"{name} {line}")
    ax.set_yscale("log")
    if xkey == "shape":
        ax.set_xticks(range(len(shapes)), [f"{m}x{n}" for m, n in shapes], rotation=20, fontsize=7)
        ax.set_xlabel("rows x n")
        ax.set_xlim(-0.5, len(shapes) - 0.5)
    else:
        ax.set_xscale("log")
        ticks = sorted({r[xkey] for r in group})
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=7)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("rows" if xkey == "rows" else "n (row length)")
    ax.set_ylabel("device time per call (us)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=6)


def write_report(records: list[dict], json_path: str, this_run: str | None = None) -> None:
    """The .md table and the .png plot beside the JSON. The .md's first line is the command
    that regenerates all three; `this_run`, when it is another (a partial, merged run), is
    named on the next."""
    stem = os.path.splitext(json_path)[0]
    full_run = FULL_RUN.format(path=json_path)
    with open(stem + ".md", "w") as f:
        f.write(f"Regenerate: `{full_run}`\n\n")
        if this_run and this_run != full_run:
            f.write(f"Last updated by: `{this_run}`\n\n")
        f.write(_describe(records))
        f.write(format_table(records) + "\n")
        if os.path.exists(cub_path(json_path)):
            f.write("\n" + cub_section(records, load_cub(cub_path(json_path))) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    panels = [(title, [r for r in records if keep(r)], *rest) for title, keep, *rest in PANELS]
    panels = [panel for panel in panels if panel[1]]
    if not panels:
        return
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 5 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        _plot_panel(ax, *panel)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "benches/results/h200.json"
    write_report(load(path), path)
