"""The main job: check the operators against jax.lax.top_k, then time them.

    python -m benches.bench [--ops OPS] [--shapes TEXTS] [--quick] [--list]
                            [--json PATH [--merge] [--report]]     (from the repository root)

On the default device (the GPU where JAX sees one, else the CPU): first a correctness pass
(random and adversarial rows, ours against jax.lax.top_k on the CPU), then a timing table
against jax.lax.top_k (rows masked to -inf past their lengths, as a JAX user would; no mask
for top_k rows without lengths), torch.topk on the GPU where torch is installed, and the HBM
read floor. Before timing it prints how long the selected shapes should take.

How time is measured (benches/README.md): on the GPU, `*_us` is device time, the sum of the
kernel durations of one call read from JAX's profiler, median over calls on distinct input
sets; `ours_wall_us` is the latency a JAX user sees (R distinct calls in one jit, median of
wall time / R). On the CPU there is no separate device: both are wall time.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import glob
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from benches import indexer, merge, report, targets
from benches import scores as scores_of
from jax_topk import top_k, topk_bf16, topk_filtered
from tests.support.families import FAMILIES, make

L2_BYTES = 60 << 20
OPS = {"topk_bf16": topk_bf16, "topk_filtered": topk_filtered, "top_k": top_k}
ALL_OPS = [*OPS, merge.OP, *indexer.OPS]
DEFAULT_RESULTS = "benches/results/h200.json"


@dataclass(frozen=True)
class Shape:
    op: str
    dtype: str  # the scores' dtype name, e.g. "bfloat16"
    rows: int
    n: int
    k: int
    lengths: str  # "full", "causal" or "valid=9000"; merge_topk: "full" or "sorted" lists
    page_size: int = 1
    heads: int = 0  # the indexer's H and D (its rows are query rows, its n the keys)
    head_dim: int = 0

    @property
    def key(self) -> tuple:
        """The record's identity (report.record_key)."""
        return tuple(self.identity().values())

    def identity(self) -> dict:
        """The record's fields that name the shape."""
        names = ("op", "dtype", "rows", "n", "k", "lengths", "page_size")
        return {name: getattr(self, name) for name in names}

    @property
    def has_lengths(self) -> bool:
        """The call passes lengths: topk_bf16 and topk_filtered always, top_k unless full,
        merge_topk never."""
        if self.op == merge.OP:
            return False
        return self.op != "top_k" or self.lengths != "full"

    @property
    def is_indexer(self) -> bool:
        return self.op in indexer.OPS

    @property
    def itemsize(self) -> int:
        return jnp.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of one input set."""
        if self.is_indexer:
            return indexer.input_bytes(self)
        if self.op == merge.OP:
            return merge.input_bytes(self)
        return self.rows * self.n * self.itemsize

    def row_lengths(self) -> np.ndarray:
        if self.lengths == "full":
            return np.full(self.rows, self.n, np.int32)
        if self.lengths == "causal":  # row i of M has length N - (M - 1 - i)
            return (self.n - (self.rows - 1 - np.arange(self.rows))).astype(np.int32)
        return np.full(self.rows, int(self.lengths.split("=")[1]), np.int32)

    def label(self) -> str:
        paged = f" page={self.page_size}" if self.page_size > 1 else ""
        heads = f" h={self.heads} d={self.head_dim}" if self.is_indexer else ""
        return (
            f"{self.op} {self.dtype} {self.rows}x{self.n}{heads} k={self.k} {self.lengths}{paged}"
        )


def indexer_shapes(
    rows_and_n, heads: int, head_dim: int, dtypes=("bfloat16", indexer.FP8), ops=indexer.OPS
) -> list[Shape]:
    """The indexer operators (both by default) on a chunk of consecutive queries of one
    sequence: causal lengths, query t of M seeing N - M + t + 1 keys."""
    return [
        Shape(op, dtype, m, n, 2048, "causal", heads=heads, head_dim=head_dim)
        for op in ops
        for dtype in dtypes
        for m, n in rows_and_n
    ]


def gpu_shapes() -> list[Shape]:
    """The grid of benches/README.md, in the order of the results table."""
    shapes = [
        Shape("topk_bf16", "bfloat16", rows, 16384, 512, lengths, 64)
        for rows in (1, 32, 128, 512, 2048)
        for lengths in ("full", "valid=9000", "valid=4096")
    ]
    shapes.append(Shape("topk_bf16", "bfloat16", 512, 16384, 2048, "full", 64))
    shapes += [
        Shape("topk_filtered", "float32", m, n, 2048, "causal")
        for m, n in (
            (5536, 131072),
            (1536, 196608),
            (5536, 262144),
            (3136, 327680),
            (1536, 393216),
            (43, 430080),
        )
    ]
    shapes.append(Shape("topk_filtered", "float32", 5536, 131072, 512, "causal"))
    shapes += [
        Shape("topk_filtered", "float32", m, n, 2048, "full")
        for m in (1, 4, 32)
        for n in (32768, 131072)
    ]
    shapes += [  # LLM sampling over a vocabulary
        Shape("top_k", dtype, b, 152064, 50, "full")
        for dtype in ("bfloat16", "float32")
        for b in (1, 8, 64, 256)
    ]
    shapes += [Shape("top_k", "float32", t, 256, 8, "full") for t in (4096, 65536)]  # MoE
    shapes += [  # short 16-bit rows (retrieval, reranking): the short-row kernel, sorted
        Shape("top_k", dtype, 2048, 16384, 64, "full") for dtype in ("bfloat16", "float16")
    ]
    shapes += [  # short float32 rows: the filtered kernel, and the register kernel's many rows
        Shape("top_k", "float32", rows, n, 64, "full") for rows, n in ((2048, 16384), (8192, 1024))
    ]
    shapes += [Shape("top_k", "bfloat16", 8192, 1024, 64, "full")]  # a warp a row, k past 32
    shapes += [  # 16-bit indexer rows, values and indices; k above the kernels' 2048
        Shape("top_k", "bfloat16", 5536, 131072, 2048, "causal"),
        Shape("top_k", "bfloat16", 32, 131072, 2048, "full"),
        Shape("top_k", "float32", 64, 131072, 4096, "full"),
    ]
    shapes += [  # eight column shards' candidates: split-KV decode, a context-parallel prefill
        Shape(merge.OP, dtype, rows, 8 * 2048, 2048, lists)
        for dtype in ("float32", "bfloat16")
        for rows in (32, 5536)
        for lists in ("full", "sorted")  # lists in no order / in rank order
    ]
    shapes += [  # two lists: a running top-k over key chunks, a split over two devices
        Shape(merge.OP, dtype, 5536, 2 * 2048, 2048, "sorted") for dtype in ("float32", "bfloat16")
    ]
    shapes += indexer_shapes(  # decode (1 and 32 queries), prefill chunks
        ((1, 131072), (32, 131072), (128, 65536), (512, 65536), (2048, 32768), (4096, 131072)),
        heads=64,
        head_dim=128,
        dtypes=("bfloat16",),
    )
    # fp8 (widened to f16 on the tensor cores at H = 64, D = 128): decode, and the logits of one
    # prefill chunk, issue 15's fp8-over-bf16 throughput at M >= 512 (the JAX path's fp8 scores
    # took 10.0 ms there on the H200, bf16's 8.9).
    shapes += indexer_shapes(((1, 131072),), heads=64, head_dim=128, dtypes=(indexer.FP8,))
    shapes += indexer_shapes(
        ((512, 65536),), heads=64, head_dim=128, dtypes=(indexer.FP8,), ops=("indexer_logits",)
    )
    return shapes


def cpu_shapes(quick: bool) -> list[Shape]:
    shapes = [
        Shape("topk_filtered", "float32", 64, 131072, 2048, "full"),
        Shape("topk_bf16", "bfloat16", 512, 16384, 512, "full", 64),
        Shape("top_k", "float32", 8, 152064, 50, "full"),
        Shape("top_k", "float32", 4096, 256, 8, "full"),
        Shape(merge.OP, "float32", 64, 8 * 256, 256, "full"),
    ]
    shapes += indexer_shapes(((8, 16384),), heads=16, head_dim=64)
    if not quick:
        shapes += indexer_shapes(((64, 32768),), heads=64, head_dim=128)
        shapes += [
            Shape("topk_filtered", "float32", 64, 131072, 512, "causal"),
            Shape("topk_bf16", "bfloat16", 128, 16384, 512, "valid=4096", 64),
            Shape("topk_filtered", "float32", 4, 262144, 2048, "full"),
            Shape("top_k", "bfloat16", 8, 152064, 50, "full"),
            Shape("top_k", "bfloat16", 16, 131072, 2048, "causal"),
            Shape("top_k", "float32", 8, 131072, 4096, "full"),
        ]
    return shapes


def select(shapes: list[Shape], ops: list[str], texts: list[str] | None) -> list[Shape]:
    """The shapes of `ops` whose label contains one of `texts` (all when None)."""
    return [
        s
        for s in shapes
        if s.op in ops and (texts is None or any(text in s.label() for text in texts))
    ]


# --- correctness -------------------------------------------------------------------------


def check_cases(ops: list[str]) -> list[tuple]:
    """(op, dtype, family, rows, n, k) for the correctness pass: every NaN-free family on a
    row of each path that the timed shapes take."""
    nan_free = [f for f in FAMILIES if f not in ("nan_mix", "random_bits")]
    cases = []
    for op, dtype in (("topk_bf16", "bfloat16"), ("topk_filtered", "float32")):
        if op in ops:
            cases += [
                (op, dtype, f, rows, n, k)
                for f in nan_free
                for rows, n, k in ((8, 1000, 64), (4, 16384, 512))
            ]
    if "topk_filtered" in ops:
        cases.append(("topk_filtered", "float32", "normal", 2, 300_001, 2048))
    if "top_k" in ops:
        cases += [  # small rows (MoE) and the filtered kernel (vocabulary), every family
            ("top_k", dtype, f, rows, n, k)
            for dtype in ("bfloat16", "float32")
            for f in nan_free
            for rows, n, k in ((8, 256, 8), (4, 20000, 50))
        ]
        cases += [
            ("top_k", "bfloat16", "normal", 2, 131072, 2048),
            ("top_k", "float32", "normal", 2, 8192, 4096),  # k above the kernels' limit
        ]
    return cases


@functools.cache
def _checked_call(op: str, k: int, sorted: bool):
    """One jit per (op, k, sorted), so the families of a shape share a compile."""
    if op == "top_k":
        return jax.jit(lambda s: top_k(s, k, sorted=sorted))
    fn = OPS[op]

    def full_rows(scores):
        lengths = jnp.full(scores.shape[:1], scores.shape[1], jnp.int32)
        return fn(scores, lengths, k=k, sorted=sorted)

    return jax.jit(full_rows)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(
        a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}")
    )


def check_against_lax(cases, progress) -> list[str]:
    """Ours (on the default device, sorted=True) must equal jax.lax.top_k on the CPU on
    NaN-free full rows: indices, and top_k's values bit for bit; the indexer operators'
    sorted=False the same set in ascending column order. Returns the failures."""
    failures = []
    rng = np.random.default_rng(0)
    cpu = jax.devices("cpu")[0]
    for op, dtype, family, rows, n, k in progress(cases, desc="check vs lax.top_k"):
        host_scores = make(family, rng, (rows, n), jnp.dtype(dtype))
        scores = jnp.asarray(host_scores)
        # The contract's order is jax.lax.top_k's on the CPU (lower column first among
        # ties); the GPU's lax.top_k need not break ties that way.
        expected_values, expected = jax.lax.top_k(jax.device_put(host_scores, cpu), k)
        if op == "top_k":
            values, indices = _checked_call(op, k, True)(scores)
            good = _same_bits(indices, expected) and _same_bits(values, expected_values)
        else:
            ranked = np.asarray(_checked_call(op, k, True)(scores))
            unordered = np.asarray(_checked_call(op, k, False)(scores))
            good = np.array_equal(ranked, expected) and np.array_equal(
                unordered, np.sort(np.asarray(expected), axis=1)
            )
        if not good:
            failures.append(f"{op} {dtype} {family} {rows}x{n} k={k}")
    return failures


# --- timing -------------------------------------------------------------------------------


def _kernel_events_by_device(trace_dir: str, with_names: bool = False) -> dict[str, list]:
    """(start_ns, duration_ns) of every GPU kernel in a profiler trace, by device plane
    (`/device:GPU:N`), each sorted by start; `with_names`: (start_ns, duration_ns, name)."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    by_device = {}
    for plane in jax.profiler.ProfileData.from_file(paths[0]).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        events = by_device.setdefault(plane.name, [])
        for line in plane.lines:
            if line.name.startswith("Stream"):
                events += [
                    (e.start_ns, e.duration_ns, e.name)
                    if with_names
                    else (e.start_ns, e.duration_ns)
                    for e in line.events
                ]
    return {name: sorted(events) for name, events in by_device.items()}


def traced_kernel_events(fn, input_sets, calls: int, with_names: bool = False) -> dict[str, list]:
    """The kernels of `calls` calls of `fn` (after one untraced call per input set), by
    device plane: `_kernel_events_by_device`."""
    for inputs in input_sets:
        jax.block_until_ready(fn(*inputs))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for i in range(calls):
                jax.block_until_ready(fn(*input_sets[i % len(input_sets)]))
        return _kernel_events_by_device(trace_dir, with_names)


def median_call_us(events, calls: int) -> float:
    """Median over calls of the summed kernel durations of one call, the events of `calls`
    calls in order; the mean where the kernels a call are not constant (should not
    happen)."""
    if not events or len(events) % calls:
        return sum(d for _, d in events) / calls / 1e3
    per_call = len(events) // calls
    totals = [sum(d for _, d in events[i * per_call : (i + 1) * per_call]) for i in range(calls)]
    return float(np.median(totals)) / 1e3


def device_time_us(fn, input_sets, calls: int) -> float:
    """Median device time of one call: the kernels of `calls` calls, grouped per call."""
    by_device = traced_kernel_events(fn, input_sets, calls)
    return median_call_us(sorted(e for events in by_device.values() for e in events), calls)


def wall_time_us(fn, input_sets, repeats: int) -> float:
    """Latency a JAX user sees: the input sets in one jit, median wall time / sets."""
    batched = jax.jit(lambda sets: [fn(*inputs) for inputs in sets])
    jax.block_until_ready(batched(input_sets))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(batched(input_sets))
        samples.append((time.perf_counter() - start) / len(input_sets))
    return float(np.median(samples)) * 1e6


def torch_topk_us(input_sets, k: int, repeats: int):
    """(median us by CUDA events, sorted selected values of the first set as float32), or
    None where torch or its GPU is absent."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tensors = [torch.from_dlpack(rows) for rows in input_sets]
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


def matrix_rate_tflops(dtype: str) -> float | None:
    """The rate of a large matmul of `dtype` operands (8192^3, A B^T, bfloat16 out): what the
    indexer's compute floor assumes. None where XLA cannot compile it."""
    size = 8192
    a, b = (jax.random.normal(jax.random.key(i), (size, size)).astype(dtype) for i in range(2))
    contract_rows = (((1,), (1,)), ((), ()))
    matmul = jax.jit(
        lambda a, b: jax.lax.dot_general(a, b, contract_rows, preferred_element_type=jnp.bfloat16)
    )
    try:
        us = device_time_us(matmul, [(a, b)], 10)
    except Exception:  # XLA's refusal (an fp8 dot without cuBLASLt) has no one type
        return None
    return 2 * size**3 / us / 1e6


@dataclass(frozen=True)
class Plan:
    """How often a shape runs; the fewest that give stable medians (benches/README.md)."""

    sets: int  # distinct input sets, cycled through
    calls: int  # traced calls of ours (and torch's timed calls)
    lax_calls: int  # traced calls of jax.lax.top_k (a full sort: 47 ms at 5536 x 131072)
    wall_sets: int  # calls in the one jit of the wall-time measure
    wall_repeats: int

    @staticmethod
    def of(shape: Shape, quick: bool, on_gpu: bool) -> Plan:
        # On the GPU, enough sets that one set's rows have left the 60 MB L2 by the time it
        # comes round again (up to 64 sets of a few MB), one set above 4 GB. The CPU has no
        # such cache to defeat and is slow: a few sets.
        if shape.nbytes > (4 << 30):
            sets = 1
        else:
            sets = max(2, min(64, math.ceil(3 * L2_BYTES / shape.nbytes) + 1))
        if not on_gpu:
            sets = min(sets, 4)
        calls = 3 if quick else 10
        lax_calls = calls if shape.rows * shape.n < (1 << 28) else 3
        return Plan(sets, calls, lax_calls, min(sets, 8), 5 if quick else 20)


def make_inputs(shape: Shape, sets: int, seed: int):
    lengths = jnp.asarray(shape.row_lengths())
    key = jax.random.key(seed)
    out = []
    for i in range(sets):
        scores = scores_of.normal(jax.random.fold_in(key, i), (shape.rows, shape.n), shape.dtype)
        extra = {}
        if shape.page_size > 1:
            pages = -(-shape.n // shape.page_size)
            perm = jax.random.permutation(jax.random.fold_in(key, 1000 + i), pages * shape.rows)
            extra["page_table"] = perm.reshape(shape.rows, pages).astype(jnp.int32)
        out.append((scores, lengths, extra))
    return out


def _mask_past_lengths(scores, lengths):
    columns = jnp.arange(scores.shape[-1])
    return jnp.where(columns < lengths[:, None], scores, -jnp.inf)


def ours_call(shape: Shape):
    """Ours as the shape calls it: (scores, lengths, extra) -> the operator's result."""
    k, page_size = shape.k, shape.page_size
    if shape.op == "top_k":
        if shape.has_lengths:
            return lambda scores, lengths, extra: top_k(scores, k, lengths=lengths)
        return lambda scores, lengths, extra: top_k(scores, k)
    fn = OPS[shape.op]
    return lambda scores, lengths, extra: fn(scores, lengths, k=k, page_size=page_size, **extra)


def lax_call(shape: Shape):
    """What a JAX user writes today: (scores, lengths) -> jax.lax.top_k's result, masked
    first where the shape has lengths; only the indices for the indexer operators."""
    k = shape.k

    def lax_top_k(scores, lengths):
        rows = _mask_past_lengths(scores, lengths) if shape.has_lengths else scores
        result = jax.lax.top_k(rows, k)
        return result if shape.op == "top_k" else result[1]

    return lax_top_k


def bench_shape(shape: Shape, on_gpu: bool, copy_tbps: float | None, quick: bool) -> dict:
    plan = Plan.of(shape, quick, on_gpu)
    inputs = make_inputs(shape, plan.sets, seed=shape.rows * 7 + shape.n)
    ours = ours_call(shape)
    ours_jit = jax.jit(ours)
    lax_jit = jax.jit(lax_call(shape))
    lax_inputs = [(s, lens) for s, lens, _ in inputs]
    if on_gpu:
        ours_us = device_time_us(ours_jit, inputs, plan.calls)
        lax_us = device_time_us(lax_jit, lax_inputs, plan.lax_calls)
        peer_rows = [
            _mask_past_lengths(s, lens) if shape.has_lengths else s for s, lens in lax_inputs
        ]
        torch_result = torch_topk_us(peer_rows, shape.k, plan.calls)
        del peer_rows
    else:
        ours_us = wall_time_us(ours, inputs[: plan.wall_sets], plan.calls)
        lax_us = wall_time_us(lax_call(shape), lax_inputs[:2], max(1, plan.calls // 3))
        torch_result = None
    torch_us = torch_result[0] if torch_result else None

    # Every compared result must select the same values (ties may pick other columns);
    # top_k's values must be the operand's at its indices, bit for bit.
    scores0, lengths0 = lax_inputs[0]

    def selected_values(indices):
        picked = jnp.take_along_axis(scores0.astype(jnp.float32), indices, axis=1)
        return np.sort(np.asarray(picked), axis=1)

    values_at_indices = None
    if shape.op == "top_k":
        ours_values, ours_indices = ours_jit(*inputs[0])
        values_at_indices = _same_bits(
            ours_values, jnp.take_along_axis(scores0, ours_indices, axis=1)
        )
        lax_indices = lax_jit(scores0, lengths0)[1]
    else:  # the check runs unpaged, where ours and lax read the same columns
        fn, k = OPS[shape.op], shape.k
        ours_indices = jax.jit(lambda s, lens: fn(s, lens, k=k))(scores0, lengths0)
        lax_indices = lax_jit(scores0, lengths0)
    ours_selected = selected_values(ours_indices)
    same_set = bool(np.array_equal(ours_selected, selected_values(lax_indices)))
    if torch_result is not None:
        same_set &= bool(np.array_equal(ours_selected, torch_result[1]))
    if on_gpu:
        wall_us = wall_time_us(ours, inputs[: plan.wall_sets], plan.wall_repeats)
    else:
        wall_us = ours_us
    valid = int(np.clip(shape.row_lengths(), 0, shape.n).sum())
    floor_us = valid * shape.itemsize / (copy_tbps * 1e12) * 1e6 if copy_tbps else None
    record = dict(
        **shape.identity(),
        ours_us=ours_us,
        lax_top_k_us=lax_us,
        torch_topk_us=torch_us,
        floor_us=floor_us,
        copy_TBps=copy_tbps,
        ours_wall_us=wall_us,
        same_set_as_peers=same_set,
        **_this_run(),
    )
    if values_at_indices is not None:
        record["values_at_indices"] = values_at_indices
    return record


def bench_merge_shape(shape: Shape, on_gpu: bool, copy_tbps, quick: bool) -> dict:
    """One merge_topk shape (benches/merge.py): ours, the lax and torch merges, the floor, and
    the check that all three select the same values."""
    plan = Plan.of(shape, quick, on_gpu)
    inputs = merge.make_inputs(shape, plan.sets, seed=shape.rows * 7 + shape.n)
    ours, lax = merge.ours_call(shape.k), merge.lax_call(shape.k)
    ours_jit, lax_jit = jax.jit(ours), jax.jit(lax)
    torch_result = None
    if on_gpu:
        ours_us = device_time_us(ours_jit, inputs, plan.calls)
        lax_us = device_time_us(lax_jit, inputs, plan.lax_calls)
        torch_result = merge.torch_merge_us(inputs, shape.k, plan.calls)
        wall_us = wall_time_us(ours, inputs[: plan.wall_sets], plan.wall_repeats)
    else:
        ours_us = wall_time_us(ours, inputs[: plan.wall_sets], plan.calls)
        lax_us = wall_time_us(lax, inputs[:2], max(1, plan.calls // 3))
        wall_us = ours_us
    ours_values = ours_jit(*inputs[0])[0]
    same_set = merge.same_values(ours_values, lax_jit(*inputs[0])[0])
    if torch_result is not None:
        same_set &= merge.same_values(ours_values, torch_result[1])
    return dict(
        **shape.identity(),
        ours_us=ours_us,
        lax_top_k_us=lax_us,
        torch_topk_us=torch_result[0] if torch_result else None,
        floor_us=shape.nbytes / (copy_tbps * 1e12) * 1e6 if copy_tbps else None,
        copy_TBps=copy_tbps,
        ours_wall_us=wall_us,
        same_set_as_peers=same_set,
        **_this_run(),
    )


def bench_indexer_shape(shape: Shape, on_gpu: bool, copy_tbps, matrix_tflops, quick: bool):
    """One indexer shape: ours and the JAX path's peers (benches/indexer.py), the floors,
    and the checks on the first input set."""
    plan = Plan.of(shape, quick, on_gpu)
    inputs = indexer.make_inputs(shape, plan.sets, seed=shape.rows * 7 + shape.n)
    timed = indexer.calls(shape.op, shape.k)
    jitted = {name: jax.jit(fn) for name, fn in timed.items()}
    times = {}
    for name, fn in timed.items():
        ours = name == "ours_us"
        if on_gpu:
            calls = plan.calls if ours else plan.lax_calls
            times[name] = device_time_us(jitted[name], inputs, calls)
        elif ours:  # the CPU: wall time, as bench_shape's
            times[name] = wall_time_us(fn, inputs[: plan.wall_sets], plan.calls)
        else:
            times[name] = wall_time_us(fn, inputs[:2], max(1, plan.calls // 3))
    if on_gpu:
        wall_us = wall_time_us(timed["ours_us"], inputs[: plan.wall_sets], plan.wall_repeats)
    else:
        wall_us = times["ours_us"]

    first = inputs[0]
    ours = jitted["ours_us"](*first)
    if shape.op == "indexer_logits":
        rows, picked = indexer.check_rows(first)
        matches = indexer.logits_within_bound(ours[rows], picked, shape.dtype)
        overlap = None
    else:
        logits = jax.jit(indexer.calls("indexer_logits", shape.k)["ours_us"])(*first)
        matches = indexer.same_indices(ours, topk_filtered(logits, first[3], k=shape.k))
        # The JAX path's two top-ks select the same values of its scores; ours, from our
        # logits, may differ from theirs only where rounding reorders near-equal logits.
        scores = jax.jit(indexer.jax_path_scores)(*first)
        picks = [jitted[name](*first) for name in ("jax_path_us", "jax_path_filtered_us")]
        values = [_selected_values(scores, p) for p in picks]
        matches &= bool(np.array_equal(*values))
        overlap = indexer.overlap(ours, picks[1])
    flops = indexer.flops(shape)
    return dict(
        **shape.identity(),
        heads=shape.heads,
        head_dim=shape.head_dim,
        **times,
        ours_wall_us=wall_us,
        compute_floor_us=flops / matrix_tflops / 1e6 if matrix_tflops else None,
        floor_us=indexer.bytes_moved(shape) / copy_tbps / 1e6 if copy_tbps else None,
        tflops=flops / times["ours_us"] / 1e6,
        matrix_TFLOPs=matrix_tflops,
        copy_TBps=copy_tbps,
        matches_contract=matches,
        jax_path_overlap=overlap,
        **_this_run(),
    )


def _this_run() -> dict:
    """The record's fields that name the run."""
    return dict(
        jax=jax.__version__,
        device=jax.devices()[0].device_kind,
        date=datetime.date.today().isoformat(),
    )


def _selected_values(scores, indices):
    """Sorted float32 scores at `indices`, -1 slots as -inf."""
    picked = jnp.take_along_axis(scores, jnp.maximum(indices, 0), axis=1)
    return np.sort(np.asarray(jnp.where(indices >= 0, picked, -jnp.inf)), axis=1)


# --- the estimate printed before timing ----------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """Seconds a run should take. Per-call times come from an earlier results file where it
    has the shape, else from the rates below (fitted to benches/results/h200.json and to a
    CPU run here). The host costs (compiles, profiler start and stop, input generation) are
    guesses: every run prints its elapsed time beside the estimate to correct them."""

    start_s: float  # import, device start, copy bandwidth
    host_s_per_shape: float  # host work a shape: about five compiles and two profiler traces
    check_case_s: float  # one correctness case
    ours_ns_per_byte: float  # ours on large rows
    ours_min_us: float
    lax_ns_per_element: dict  # by itemsize: a full sort of every row
    lax_min_us: float
    torch_ns_per_element: float | None  # None: no torch peer
    indexer_ours_tflops: float  # the indexer operators on the tensor cores (H = 64, D = 128)
    indexer_portable_tflops: float  # the portable CUDA-core kernel (other H and D)
    indexer_jax_tflops: float  # the JAX einsum path's scores

    def indexer_call_us(self, shape: Shape, known: dict | None) -> tuple[float, float, float]:
        """(ours, all the JAX path's peers together, 0) us a call."""
        peers = [name for name in indexer.calls(shape.op, shape.k) if name != "ours_us"]
        if known:
            return known["ours_us"], sum(known.get(name) or 0.0 for name in peers), 0.0
        flops = indexer.flops(shape)
        rate = (
            self.indexer_ours_tflops if shape.dtype == "bfloat16" else self.indexer_portable_tflops
        )
        ours = max(self.ours_min_us, flops / rate / 1e6)
        scores = max(self.lax_min_us, flops / self.indexer_jax_tflops / 1e6)
        if shape.op == "indexer_logits":
            return ours, scores, 0.0
        sort = shape.rows * shape.n * self.lax_ns_per_element[4] / 1e3
        return ours, 2 * scores + sort + ours, 0.0

    def call_us(self, shape: Shape, prior: dict) -> tuple[float, float, float]:
        """(ours, lax.top_k, torch.topk) us a call."""
        known = prior.get(shape.key)
        if shape.is_indexer:
            return self.indexer_call_us(shape, known)
        if known:
            return known["ours_us"], known["lax_top_k_us"], known["torch_topk_us"] or 0.0
        elements = shape.rows * shape.n
        ours = max(self.ours_min_us, shape.nbytes * self.ours_ns_per_byte / 1e3)
        lax = max(self.lax_min_us, elements * self.lax_ns_per_element[shape.itemsize] / 1e3)
        torch = 0.0
        if self.torch_ns_per_element is not None:
            torch = max(100.0, elements * self.torch_ns_per_element / 1e3)
        return ours, lax, torch

    def shape_seconds(self, shape: Shape, quick: bool, on_gpu: bool, prior: dict) -> float:
        plan = Plan.of(shape, quick, on_gpu)
        ours, lax, torch = self.call_us(shape, prior)
        ours_calls = plan.sets + plan.calls + plan.wall_sets * (plan.wall_repeats + 1) + 1
        lax_calls = plan.sets + plan.lax_calls + 1
        torch_calls = plan.sets + 1 + plan.calls
        return (
            self.host_s_per_shape
            + (ours * ours_calls + lax * lax_calls + torch * torch_calls) / 1e6
        )


GPU_COSTS = CostModel(
    start_s=30.0,
    host_s_per_shape=6.0,
    check_case_s=0.4,
    ours_ns_per_byte=1.3 / 4150,  # 1.3x the read floor at 4.15 TB/s
    ours_min_us=15.0,
    lax_ns_per_element={2: 0.05, 4: 0.065},
    lax_min_us=30.0,
    torch_ns_per_element=0.012,
    indexer_ours_tflops=450.0,  # the 55 % of the bf16 matrix rate
    indexer_portable_tflops=1.0,  # a reviewer's estimate of the CUDA-core kernel, not measured
    indexer_jax_tflops=60.0,  # XLA's einsum path measured for issue 15
)
CPU_COSTS = CostModel(
    start_s=5.0,
    host_s_per_shape=2.0,
    check_case_s=0.2,
    ours_ns_per_byte=3.0,
    ours_min_us=100.0,
    lax_ns_per_element={2: 450.0, 4: 25.0},
    lax_min_us=100.0,
    torch_ns_per_element=None,
    indexer_ours_tflops=0.05,
    indexer_portable_tflops=0.05,
    indexer_jax_tflops=0.05,
)


def load_prior(path: str | None) -> dict:
    """Earlier records by shape key, for the estimate; empty when there are none."""
    if not path or not os.path.exists(path):
        return {}
    return {report.record_key(r): r for r in report.load(path)}


def print_estimate(shapes, cases, quick: bool, on_gpu: bool, prior: dict) -> float:
    costs = GPU_COSTS if on_gpu else CPU_COSTS
    per_shape = [costs.shape_seconds(s, quick, on_gpu, prior) for s in shapes]
    check_s = len(cases) * costs.check_case_s
    total = costs.start_s + check_s + sum(per_shape)
    by_op = {}
    for shape, seconds in zip(shapes, per_shape):
        by_op[shape.op] = by_op.get(shape.op, 0.0) + seconds
    parts = ", ".join(f"{op} {seconds:.0f} s" for op, seconds in by_op.items())
    print(
        f"estimate: {len(shapes)} shapes, {len(cases)} check cases, about {total / 60:.1f} min "
        f"(start {costs.start_s:.0f} s, check {check_s:.0f} s, {parts}; "
        f"{sum(1 for s in shapes if s.key in prior)} shapes timed from earlier results)"
    )
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benches.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--ops",
        default=",".join(ALL_OPS),
        help=f"comma-separated operators to check and time (default: all of {','.join(ALL_OPS)})",
    )
    parser.add_argument(
        "--shapes",
        metavar="TEXTS",
        help="comma-separated texts; time only shapes whose label contains one, e.g. "
        "'x152064,bfloat16 5536x131072' (labels: --list)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument(
        "--grid",
        choices=("gpu", "cpu"),
        help="the shape grid (default: the device's); with --list, see the GPU grid's "
        "estimate from a machine without one",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the selected shapes and the estimate, run nothing",
    )
    parser.add_argument("--skip-check", action="store_true", help="time only")
    parser.add_argument("--json", metavar="PATH", help="write the records (benches/README.md)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --json: keep the file's records of shapes not timed now, replace the others",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="with --json: also write the .md table and .png plot beside it",
    )
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    if args.grid == "gpu" and device.platform != "gpu" and not args.list:
        parser.error("--grid gpu without a GPU: only with --list")
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - set(ALL_OPS))
    if unknown:
        parser.error(f"--ops: unknown {unknown}; the operators are {ALL_OPS}")
    if (args.merge or args.report) and not args.json:
        parser.error("--merge and --report need --json PATH")

    on_gpu = (args.grid or ("gpu" if device.platform == "gpu" else "cpu")) == "gpu"
    shapes = gpu_shapes() if on_gpu else cpu_shapes(args.quick)
    if args.quick and on_gpu:
        shapes = [s for s in shapes if s.rows * s.n <= 512 * 16384 or s.rows == 43]
    shapes = select(shapes, ops, args.shapes.split(",") if args.shapes else None)
    indexer_dtypes = sorted({s.dtype for s in shapes if s.is_indexer})
    cases = [] if args.skip_check else check_cases(ops)
    indexer_cases = [] if args.skip_check else indexer.check_cases(indexer_dtypes)
    prior = load_prior(args.json) or (load_prior(DEFAULT_RESULTS) if on_gpu else {})
    print(f"jax_topk bench on {device.device_kind} ({device.platform}), jax {jax.__version__}")
    if args.list:
        for shape in shapes:
            print("  " + shape.label())
    estimate_s = print_estimate(shapes, cases + indexer_cases, args.quick, on_gpu, prior)
    if args.list:
        return 0
    started = time.perf_counter()

    from tqdm.auto import tqdm as progress

    if cases:
        failures = check_against_lax(cases, progress)
        if failures:
            print("MISMATCH against jax.lax.top_k:\n  " + "\n  ".join(failures))
            return 1
        print("check: every case equals jax.lax.top_k")
    if indexer_cases:
        failures = indexer.check(indexer_cases, progress)
        if failures:
            print("MISMATCH in the indexer check:\n  " + "\n  ".join(failures))
            return 1
        print("check: indexer_topk equals topk_filtered(indexer_logits), logits within bound")
    copy_tbps = copy_bandwidth_tbps() if on_gpu else None
    matrix_rates = {}
    if on_gpu and indexer_dtypes:  # the compute floor's rate, of the rows' own dtype
        matrix_rates = {d: matrix_rate_tflops(d) for d in sorted({"bfloat16", *indexer_dtypes})}
        fp8_rate = matrix_rates.get(indexer.FP8, 0)
        if fp8_rate is None:
            print("no fp8 matmul in XLA here: fp8 compute floors at the bf16 rate")
            matrix_rates[indexer.FP8] = matrix_rates["bfloat16"]
        elif fp8_rate and fp8_rate < 1.2 * matrix_rates["bfloat16"]:
            print("the fp8 matmul is not much faster than bf16's: XLA may not use fp8 MMA")
    records = [
        bench_indexer_shape(shape, on_gpu, copy_tbps, matrix_rates.get(shape.dtype), args.quick)
        if shape.is_indexer
        else bench_merge_shape(shape, on_gpu, copy_tbps, args.quick)
        if shape.op == merge.OP
        else bench_shape(shape, on_gpu, copy_tbps, args.quick)
        for shape in progress(shapes, desc="timing")
    ]
    if copy_tbps:
        print(f"copy bandwidth: {copy_tbps:.2f} TB/s (read + write)")
    for dtype, rate in matrix_rates.items():
        print(f"matrix rate for the compute floor, {dtype} rows: {rate:.0f} TFLOP/s")
    print("time per call in us" + (" (device time)" if on_gpu else " (wall time, CPU)"))
    print(report.format_table(records))
    print(f"elapsed {time.perf_counter() - started:.0f} s (estimated {estimate_s:.0f} s)")
    if args.json:
        if args.merge and os.path.exists(args.json):
            order = [s.key for s in gpu_shapes() + cpu_shapes(quick=False)]
            records = report.merge(report.load(args.json), records, order)
        report.save(records, args.json)
        if args.report:
            this_run = shlex.join(
                ["python", "-m", "benches.bench"] + (argv if argv is not None else sys.argv[1:])
            )
            report.write_report(records, args.json, this_run)
            if os.path.basename(args.json) == os.path.basename(targets.DEFAULT_JSON):
                targets.write(records, args.json)  # the issues' targets, from these rows
    return 0


if __name__ == "__main__":
    sys.exit(main())
