"""The main job: check both operators against jax.lax.top_k, then time them.

    python -m benches.bench [--quick] [--json PATH] [--report]     (from the repository root)

On the default device (the GPU where JAX sees one, else the CPU): first a correctness pass
(random and adversarial rows, ours against jax.lax.top_k on the same device), then a timing
table against jax.lax.top_k (rows masked to -inf past their lengths, as a JAX user would),
torch.topk on the GPU where torch is installed, and the HBM read floor.

How time is measured (benches/README.md): on the GPU, `*_us` is device time, the sum of the
kernel durations of one call read from JAX's profiler, median over calls on distinct input
sets; `ours_wall_us` is the latency a JAX user sees (R distinct calls in one jit, median of
wall time / R). On the CPU there is no separate device: both are wall time.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import topk_bf16, topk_filtered
from tests.support.families import FAMILIES, make

L2_BYTES = 60 << 20
OPS = {"topk_bf16": (topk_bf16, jnp.bfloat16), "topk_filtered": (topk_filtered, jnp.float32)}


@dataclass(frozen=True)
class Shape:
    op: str
    rows: int
    n: int
    k: int
    lengths: str  # "full", "causal" or "valid=9000"
    page_size: int = 1

    def row_lengths(self) -> np.ndarray:
        if self.lengths == "full":
            return np.full(self.rows, self.n, np.int32)
        if self.lengths == "causal":  # row i of M has length N - (M - 1 - i)
            return (self.n - (self.rows - 1 - np.arange(self.rows))).astype(np.int32)
        return np.full(self.rows, int(self.lengths.split("=")[1]), np.int32)

    def label(self) -> str:
        paged = f" page={self.page_size}" if self.page_size > 1 else ""
        return f"{self.op} {self.rows}x{self.n} k={self.k} {self.lengths}{paged}"


def gpu_shapes() -> list[Shape]:
    shapes = [
        Shape("topk_bf16", rows, 16384, 512, lengths, 64)
        for rows in (1, 32, 128, 512, 2048)
        for lengths in ("full", "valid=9000", "valid=4096")
    ]
    shapes.append(Shape("topk_bf16", 512, 16384, 2048, "full", 64))
    shapes += [
        Shape("topk_filtered", m, n, 2048, "causal")
        for m, n in (
            (5536, 131072),
            (1536, 196608),
            (5536, 262144),
            (3136, 327680),
            (1536, 393216),
            (43, 430080),
        )
    ]
    shapes.append(Shape("topk_filtered", 5536, 131072, 512, "causal"))
    shapes += [
        Shape("topk_filtered", m, n, 2048, "full") for m in (1, 4, 32) for n in (32768, 131072)
    ]
    return shapes


def cpu_shapes(quick: bool) -> list[Shape]:
    shapes = [
        Shape("topk_filtered", 64, 131072, 2048, "full"),
        Shape("topk_bf16", 512, 16384, 512, "full", 64),
    ]
    if not quick:
        shapes += [
            Shape("topk_filtered", 64, 131072, 512, "causal"),
            Shape("topk_bf16", 128, 16384, 512, "valid=4096", 64),
            Shape("topk_filtered", 4, 262144, 2048, "full"),
        ]
    return shapes


# --- correctness -------------------------------------------------------------------------


def check_against_lax(progress) -> list[str]:
    """Ours (on the default device, sorted=True) must equal jax.lax.top_k's indices on
    NaN-free full rows, and sorted=False the same set in ascending order. Returns the
    failures."""
    failures = []
    rng = np.random.default_rng(0)
    nan_free = [f for f in FAMILIES if f not in ("nan_mix", "random_bits")]
    cases = [
        (op, f, rows, n, k)
        for op in OPS
        for f in nan_free
        for rows, n, k in ((8, 1000, 64), (4, 16384, 512))
    ]
    cases += [("topk_filtered", "normal", 2, 300_001, 2048)]
    for op, family, rows, n, k in progress(cases, desc="check vs lax.top_k"):
        fn, dtype = OPS[op]
        host_scores = make(family, rng, (rows, n), dtype)
        scores = jnp.asarray(host_scores)
        lengths = jnp.full((rows,), n, jnp.int32)
        # The contract's order is jax.lax.top_k's on the CPU (lower column first among
        # ties); the GPU's lax.top_k need not break ties that way.
        cpu = jax.devices("cpu")[0]
        expected = np.asarray(jax.lax.top_k(jax.device_put(host_scores, cpu), k)[1])
        ranked = np.asarray(jax.jit(lambda s, lens: fn(s, lens, k=k, sorted=True))(scores, lengths))
        unordered = np.asarray(jax.jit(lambda s, lens: fn(s, lens, k=k))(scores, lengths))
        if not (
            np.array_equal(ranked, expected)
            and np.array_equal(unordered, np.sort(expected, axis=1))
        ):
            failures.append(f"{op} {family} {rows}x{n} k={k}")
    return failures


# --- timing -------------------------------------------------------------------------------


def _stream_kernel_events(trace_dir: str):
    """(start_ns, duration_ns) of every GPU kernel in a profiler trace."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    events = []
    for plane in jax.profiler.ProfileData.from_file(paths[0]).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if line.name.startswith("Stream"):
                events += [(e.start_ns, e.duration_ns) for e in line.events]
    return sorted(events)


def device_time_us(fn, input_sets, calls: int) -> float:
    """Median device time of one call: the kernels of `calls` calls, grouped per call."""
    for inputs in input_sets:
        jax.block_until_ready(fn(*inputs))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for i in range(calls):
                jax.block_until_ready(fn(*input_sets[i % len(input_sets)]))
        events = _stream_kernel_events(trace_dir)
    if not events or len(events) % calls:
        # Kernels per call not constant (should not happen): report the mean.
        return sum(d for _, d in events) / calls / 1e3
    per_call = len(events) // calls
    totals = [sum(d for _, d in events[i * per_call : (i + 1) * per_call]) for i in range(calls)]
    return float(np.median(totals)) / 1e3


def wall_time_us(fn, input_sets, repeats: int) -> float:
    """Latency a JAX user sees: all input sets in one jit, median wall time / sets."""
    batched = jax.jit(lambda sets: [fn(*inputs) for inputs in sets])
    jax.block_until_ready(batched(input_sets))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(batched(input_sets))
        samples.append((time.perf_counter() - start) / len(input_sets))
    return float(np.median(samples)) * 1e6


def torch_topk_us(input_sets, k: int, repeats: int):
    """(median us by CUDA events, sorted selected values of the first set), or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tensors = [torch.from_dlpack(masked) for masked in input_sets]
    for t in tensors:
        torch.topk(t, k, dim=-1)
    values = torch.topk(tensors[0], k, dim=-1).values.float()
    values = np.sort(values.cpu().numpy(), axis=1)
    samples = []
    for i in range(repeats):
        t = tensors[i % len(tensors)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.topk(t, k, dim=-1)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return float(np.median(samples)), values


def copy_bandwidth_tbps() -> float:
    """A large device-to-device copy, counting bytes read plus written."""
    nbytes = 2 << 30
    x = jnp.zeros((nbytes // 4,), jnp.float32)
    copy = jax.jit(lambda a: a + 1.0)
    us = device_time_us(copy, [(x,)], 10)
    return 2 * nbytes / (us * 1e-6) / 1e12


def make_inputs(shape: Shape, sets: int, seed: int):
    _, dtype = OPS[shape.op]
    lengths = jnp.asarray(shape.row_lengths())
    key = jax.random.key(seed)
    out = []
    for i in range(sets):
        scores = jax.random.normal(jax.random.fold_in(key, i), (shape.rows, shape.n), dtype)
        extra = {}
        if shape.page_size > 1:
            pages = -(-shape.n // shape.page_size)
            perm = jax.random.permutation(jax.random.fold_in(key, 1000 + i), pages * shape.rows)
            extra["page_table"] = perm.reshape(shape.rows, pages).astype(jnp.int32)
        out.append((scores, lengths, extra))
    return out


def bench_shape(shape: Shape, on_gpu: bool, copy_tbps: float | None, quick: bool) -> dict:
    fn, dtype = OPS[shape.op]
    itemsize = jnp.dtype(dtype).itemsize
    nbytes = shape.rows * shape.n * itemsize
    sets = max(2, min(8, math.ceil(4 * L2_BYTES / nbytes)))
    if nbytes > (4 << 30):
        sets = 1
    inputs = make_inputs(shape, sets, seed=shape.rows * 7 + shape.n)
    k, page_size = shape.k, shape.page_size

    def ours(scores, lengths, extra):
        return fn(scores, lengths, k=k, page_size=page_size, **extra)

    def lax_top_k(scores, lengths):
        columns = jnp.arange(scores.shape[-1])
        masked = jnp.where(columns < lengths[:, None], scores, -jnp.inf)
        return jax.lax.top_k(masked, k)[1]

    ours_jit = jax.jit(ours)
    lax_jit = jax.jit(lax_top_k)
    lax_inputs = [(s, lens) for s, lens, _ in inputs]
    calls = 3 if quick else 10
    lax_calls = calls if shape.rows * shape.n < (1 << 28) else 3
    if on_gpu:
        ours_us = device_time_us(ours_jit, inputs, calls)
        lax_us = device_time_us(lax_jit, lax_inputs, lax_calls)
        masked = [
            jnp.where(jnp.arange(shape.n) < lens[:, None], s, -jnp.inf) for s, lens in lax_inputs
        ]
        torch_result = torch_topk_us(masked, k, calls)
        del masked
    else:
        ours_us = wall_time_us(ours, inputs, calls)
        lax_us = wall_time_us(lax_top_k, lax_inputs, max(1, calls // 3))
        torch_result = None
    torch_us = torch_result[0] if torch_result else None

    # Every compared result must select the same values (ties may pick other columns).
    def selected_values(indices):
        picked = jnp.take_along_axis(lax_inputs[0][0].astype(jnp.float32), indices, axis=1)
        return np.sort(np.asarray(picked), axis=1)

    scores0, lengths0 = lax_inputs[0]
    ours_values = selected_values(jax.jit(lambda s, lens: fn(s, lens, k=k))(scores0, lengths0))
    same_set = bool(np.array_equal(ours_values, selected_values(lax_jit(scores0, lengths0))))
    if torch_result is not None:
        same_set &= bool(np.array_equal(ours_values, torch_result[1]))
    wall_us = wall_time_us(ours, inputs, 5 if quick else 20) if on_gpu else ours_us
    valid = int(np.clip(shape.row_lengths(), 0, shape.n).sum())
    floor_us = valid * itemsize / (copy_tbps * 1e12) * 1e6 if copy_tbps else None
    return dict(
        op=shape.op,
        rows=shape.rows,
        n=shape.n,
        k=shape.k,
        lengths=shape.lengths,
        page_size=shape.page_size,
        ours_us=ours_us,
        lax_top_k_us=lax_us,
        torch_topk_us=torch_us,
        floor_us=floor_us,
        copy_TBps=copy_tbps,
        ours_wall_us=wall_us,
        same_set_as_peers=same_set,
        jax=jax.__version__,
        device=jax.devices()[0].device_kind,
        date=datetime.date.today().isoformat(),
    )


def format_table(records: list[dict]) -> str:
    def fmt(v):
        return "-" if v is None else f"{v:,.1f}"

    header = (
        "| op | rows | n | k | lengths | ours (us) | ours wall (us) | lax.top_k (us) | "
        "torch.topk (us) | floor (us) | ours/floor | speed-up vs lax | same set |"
    )
    lines = [header, "|" + " --- |" * 13]
    for r in records:
        ratio = r["ours_us"] / r["floor_us"] if r.get("floor_us") else None
        lines.append(
            f"| {r['op']} | {r['rows']} | {r['n']} | {r['k']} | {r['lengths']} | "
            f"{fmt(r['ours_us'])} | {fmt(r['ours_wall_us'])} | {fmt(r['lax_top_k_us'])} | "
            f"{fmt(r['torch_topk_us'])} | {fmt(r['floor_us'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{r['lax_top_k_us'] / r['ours_us']:.1f}x | "
            f"{'yes' if r.get('same_set_as_peers') else 'NO'} |"
        )
    return "\n".join(lines)


def write_report(records: list[dict], json_path: str, command: str) -> None:
    """The .md table and the .png plot beside the JSON, with the command that made them."""
    stem = os.path.splitext(json_path)[0]
    device = records[0]["device"] if records else "?"
    with open(stem + ".md", "w") as f:
        f.write(f"Regenerate: `{command}`\n\n")
        f.write(
            f"Device: {device}; jax {records[0].get('jax', jax.__version__)}; "
            f"{records[0]['date']}. Times are "
            "device time per call in microseconds (sum of kernel durations from JAX's "
            "profiler, median over calls on distinct inputs), except 'ours wall', the "
            "latency a JAX user sees. lax.top_k runs on rows masked to -inf past their "
            "lengths (mask included); torch.topk on the same masked rows (CUDA events). "
            "Floor = valid bytes / measured copy bandwidth. Scores: random normal.\n\n"
        )
        f.write(format_table(records) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = [  # (title, records, x key, the key that makes one line)
        (
            "topk_bf16 (k, lengths)",
            [r for r in records if r["op"] == "topk_bf16"],
            "rows",
            lambda r: f"k={r['k']} {r['lengths']}",
        ),
        (
            "topk_filtered causal chunks (k)",
            [r for r in records if r["op"] == "topk_filtered" and r["lengths"] == "causal"],
            "shape",
            lambda r: f"k={r['k']}",
        ),
        (
            "topk_filtered decode (rows)",
            [r for r in records if r["op"] == "topk_filtered" and r["lengths"] != "causal"],
            "n",
            lambda r: f"rows={r['rows']}",
        ),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 5.5))
    peers = (
        ("ours_us", "o-", "ours"),
        ("lax_top_k_us", "s--", "lax.top_k"),
        ("torch_topk_us", "^:", "torch.topk"),
        ("floor_us", "x-.", "HBM floor"),
    )
    for ax, (title, group, xkey, line_of) in zip(axes, panels):
        shapes = sorted({(r["rows"], r["n"]) for r in group}, key=lambda s: s[0] * s[1])
        for line in sorted({line_of(r) for r in group}):
            if xkey == "shape":  # causal chunks: one category per (M, N), by total size
                pts = sorted(
                    (r for r in group if line_of(r) == line),
                    key=lambda r: shapes.index((r["rows"], r["n"])),
                )
                xs = [shapes.index((r["rows"], r["n"])) for r in pts]
            else:
                pts = sorted((r for r in group if line_of(r) == line), key=lambda r: r[xkey])
                xs = [r[xkey] for r in pts]
            for key, style, name in peers:
                ys = [r.get(key) for r in pts]
                if all(y is not None for y in ys):
                    ax.plot(xs, ys, style, label=f"{name} {line}")
        ax.set_yscale("log")
        if xkey == "shape":
            ax.set_xticks(
                range(len(shapes)), [f"{m}x{n}" for m, n in shapes], rotation=20, fontsize=7
            )
            ax.set_xlabel("M x N")
        else:
            ax.set_xscale("log")
            ax.set_xlabel("rows" if xkey == "rows" else "N (row length)")
        ax.set_ylabel("device time per call (us)")
        ax.set_title(title)
        if group:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benches.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument("--json", metavar="PATH", help="write the records (benches/README.md)")
    parser.add_argument(
        "--report",
        action="store_true",
        help="with --json: also write the .md table and .png plot beside it",
    )
    parser.add_argument("--only", metavar="OP", choices=list(OPS), help="one operator")
    parser.add_argument("--skip-check", action="store_true", help="time only")
    args = parser.parse_args(argv)

    from tqdm.auto import tqdm as progress

    device = jax.devices()[0]
    on_gpu = device.platform == "gpu"
    print(f"jax_topk bench on {device.device_kind} ({device.platform}), jax {jax.__version__}")
    if not args.skip_check:
        failures = check_against_lax(progress)
        if failures:
            print("MISMATCH against jax.lax.top_k:\n  " + "\n  ".join(failures))
            return 1
        print("check: every case equals jax.lax.top_k")
    shapes = gpu_shapes() if on_gpu else cpu_shapes(args.quick)
    if args.quick and on_gpu:
        shapes = [s for s in shapes if s.rows * s.n <= 512 * 16384 or s.rows == 43]
    if args.only:
        shapes = [s for s in shapes if s.op == args.only]
    copy_tbps = copy_bandwidth_tbps() if on_gpu else None
    records = []
    for shape in progress(shapes, desc="timing"):
        records.append(bench_shape(shape, on_gpu, copy_tbps, args.quick))
    if copy_tbps:
        print(f"copy bandwidth: {copy_tbps:.2f} TB/s (read + write)")
    print("time per call in us" + (" (device time)" if on_gpu else " (wall time, CPU)"))
    print(format_table(records))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        if args.report:
            write_report(
                records,
                args.json,
                "python -m benches.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
