"""Differential fuzzing of the kernels: random calls of every selecting operator, each row of
its own adversarial value family, shapes and k near the dispatch boundaries, lengths at every
edge, page tables and num_valid_rows, and the dispatch switches forced at random.

On a GPU each result is compared with the CPU handler's, bit for bit (indices and values), except
indexer_topk's, which is compared with topk_filtered of indexer_logits on the GPU itself (the
logits of the two backends are not bit-equal: docs/contract.md section 9). Without a GPU the CPU
handler is compared with the NumPy contract instead, which exercises the generator
(tests/test_fuzz_check.py runs that way in CI).

    python -m tests.checks.fuzz [--seconds 240] [--first I] [--cases N] [--seed S] [--case I]
                                [--out DIR] [--max-elements E] [--require-gpu] [--announce]
                                [--skip-xla-sort]

A case is a function of (seed, index, max elements) alone: `--seed S --case I` (with the same
--max-elements) replays one, `--first I --cases N` runs cases I to I + N - 1. Under
compute-sanitizer a small --max-elements keeps each case quick, and a chunk of cases a
sanitizer process keeps the tool up (`.ci/gpu memcheck-fuzz`: CUDA 13.0's compute-sanitizer
itself segfaulted after 10 to ~770 cases in one process, benches/NOTES.md "the sanitizer's own
crash"). Both crashes whose case is known came in a top_k case of XLA's sort path, which runs
no kernel of ours: `--skip-xla-sort` leaves those out (not in a replay of one case). Progress
goes to stdout every 15 s (`--announce`: each case's label before it runs, which names the case
a hang or a crash stopped in); each mismatch is appended to DIR/failures.jsonl with its case and
its arrays written to DIR/case-S-I.npz. Exit status 1 if a case differs or none ran, 2 if
--require-gpu finds no GPU or a build without the CUDA extension.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import jax_topk
from jax_topk._lowering import HAS_CUDA_EXTENSION
from jax_topk._top_k import Route as TopKRoute
from jax_topk._top_k import route as top_k_route
from tests.support import families
from tests.support.families import one_coarse_bin, sample_foolers, tied_group_rows
from tests.support.indexer import FP8, make_inputs
from tests.support.operators import gpu_devices, kernel_switches, run_on
from tests.support.reference import reference_topk
from tests.test_merge_topk import in_rank_order
from tests.test_top_k import reference_top_k

DTYPES = {"float32": families.F32, "bfloat16": families.BF16, "float16": families.F16}
# Widths on either side of the routes' limits: small rows (<= 1024), the filtered kernel's
# shared candidates (8192), the register and argmax kernels (16384), the cluster kernels'
# registers (32768 to 262144), vocabulary rows.
WIDTHS = [1, 2, 31, 33, 255, 256, 257, 1000, 1024, 1025, 2047, 2048, 2049, 4096, 4097, 8191,
          8192, 8193, 12345, 16383, 16384, 16385, 32767, 32768, 32769, 65536, 65537, 131072,
          152064, 196608, 262144, 262145]  # fmt: skip
KS = [1, 2, 7, 8, 16, 17, 32, 33, 50, 64, 65, 256, 257, 512, 1024, 1500, 2047, 2048]
# Row counts around the SM counts (132 on an H100 / H200, two blocks each) and the small-row
# routes' row thresholds (1024).
ROW_COUNTS = [1, 2, 3, 4, 5, 8, 13, 31, 32, 33, 64, 100, 131, 132, 133, 200, 264, 265, 700,
              1023, 1024, 1025, 2048]  # fmt: skip
MAX_ELEMENTS = 6_000_000  # a case's scores by default (the NumPy reference's time)
INDEXER_HEADS, INDEXER_DIM = 64, 128
# Dispatch switches of the selecting kernels (read by the CUDA handlers at each launch), each
# with the values a case may force; none of them changes a result, only the kernel that computes
# it. A case compiles a fresh executable and runs it once, inside its switches. merge_topk's
# narrow instances and indexer_topk's path have switches of their own (make_case).
SWITCHES = {
    "JAX_TOPK_F32_CLUSTER": ["off", "always"],
    "JAX_TOPK_FILTERED_SPLIT": ["off"],
    "JAX_TOPK_F32_ROWS": ["off", "always", "wide", "many"],
    "JAX_TOPK_SMALL_ROWS": ["digits"],
    "JAX_TOPK_ARGMAX": ["off", "always"],
    "JAX_TOPK_SHORT_16BIT": ["own"],
    "JAX_TOPK_BF16_SORT": ["radix"],
}
OP_WEIGHTS = {"top_k": 4, "topk_filtered": 3, "topk_bf16": 2, "merge_topk": 2, "indexer_topk": 1}
# Rows built against a kernel's steps: whether a row of (n, k) holds the family, and its maker
# (rng, rows, n, k, dtype). Float32 rows narrowed to a 16-bit type keep fewer distinct values
# (one_coarse_bin's become a few bins of ties).
BUILT_ROWS = {
    "kth_key_at_the_cutoff": (lambda n, k: n > k + 6000, families.kth_key_at_the_cutoff),
    "few_keys_over_a_span": (
        lambda n, k: k == 2048 and n >= 4 * k,
        families.few_keys_over_a_span,
    ),
    "sample_foolers": (lambda n, k: True, lambda rng, rows, n, k, dt: sample_foolers(rng, rows, n)),
    "one_coarse_bin": (lambda n, k: True, lambda rng, rows, n, k, dt: one_coarse_bin(rng, rows, n)),
    "tied_group": (
        lambda n, k: k > 16 and n >= k + 40,
        lambda rng, rows, n, k, dt: tied_group_rows(rng, rows, n, k, [2, 32, 33][rows % 3]),
    ),
}
INDEXER_FAMILIES = ["normal", "repeated_keys", "zero_heads", "all_negative", "integers",
                    "periodic", "random_bits"]  # fmt: skip


@dataclasses.dataclass
class Case:
    """Every random choice of a case but its data (drawn from its own generator in run_case)."""

    index: int
    op: str
    dtype: str
    rows: int
    n: int
    k: int
    sorted: bool
    lengths_kind: str  # "none" (top_k only), "full", "edges", "causal", "random"
    families: list[str]  # a family for each block of consecutive rows
    switches: dict[str, str]
    paged: bool = False  # topk_bf16, topk_filtered, indexer_topk
    num_valid_rows: int | None = None  # the same three
    two_axes: bool = False  # top_k: the rows as a leading shape (2, rows / 2)
    lists: int = 0  # merge_topk: candidate lists a row, each of per_list entries
    per_list: int = 0
    rank_order: bool = False  # merge_topk: each list as top_k(sorted=True) returns it

    def label(self) -> str:
        details = [f"lengths={self.lengths_kind}", "families=" + ",".join(self.families)]
        details += ["paged"] * self.paged + ["two axes"] * self.two_axes
        if self.num_valid_rows is not None:
            details.append(f"valid={self.num_valid_rows}")
        if self.op == "merge_topk":
            details.append(f"{self.lists} lists of {self.per_list}" + " ranked" * self.rank_order)
        details += [f"{name}={value}" for name, value in self.switches.items()]
        return (
            f"#{self.index} {self.op} {self.dtype} {self.rows}x{self.n} k={self.k} "
            f"sorted={self.sorted} " + " ".join(details)
        )


def _pick(rng, options):
    return options[int(rng.integers(0, len(options)))]


def _width(rng, large: bool) -> int:
    if rng.random() < 0.6:
        return _pick(rng, [w for w in WIDTHS if (w > 20000) == large])
    return int(rng.integers(20001, 300000)) if large else int(rng.integers(1, 20001))


def _k(rng, op: str, n: int) -> int:
    if op == "top_k":  # 1 <= k <= n, past 2048 too (rounds, the sort)
        k = _pick(rng, KS + [n, n - 1, 2049, 3000, 4096]) if rng.random() < 0.8 else None
        return max(1, min(int(rng.integers(1, n + 1)) if k is None else k, n))
    return _pick(rng, KS) if rng.random() < 0.85 else int(rng.integers(1, 2049))


def make_case(seed: int, index: int, max_elements: int = MAX_ELEMENTS) -> Case:
    """Case `index` of `seed`, its scores at most `max_elements` (another bound draws other
    widths and row counts, so a case replays only under the bound it was drawn with)."""
    rng = np.random.default_rng([seed, index])
    ops = list(OP_WEIGHTS)
    weights = np.array([OP_WEIGHTS[o] for o in ops], float)
    op = ops[int(rng.choice(len(ops), p=weights / weights.sum()))]
    dtype = "bfloat16" if op == "topk_bf16" else _pick(rng, list(DTYPES))
    large = op != "topk_bf16" and rng.random() < 0.3
    n = min(_width(rng, large), max_elements, 16384 if op == "topk_bf16" else max_elements)
    rows = max(1, min(_pick(rng, ROW_COUNTS), max_elements // n))
    k = _k(rng, op, n)
    kinds = ["full", "edges", "causal", "random"] + ["none"] * 2 * (op == "top_k")
    names = sorted(families.FAMILIES) + sorted(BUILT_ROWS) * 2
    row_families = [_pick(rng, names) for _ in range(int(rng.integers(1, 5)))]
    if "few_keys_over_a_span" in row_families and n >= 8192:
        k = 2048  # its rows hold 2048 winners
    switches = {}
    if op != "merge_topk" and rng.random() < 0.5:
        for name in rng.choice(sorted(SWITCHES), size=int(rng.integers(1, 3)), replace=False):
            switches[str(name)] = _pick(rng, SWITCHES[str(name)])
    if op == "merge_topk" and rng.random() < 0.3:
        switches["JAX_TOPK_MERGE_NARROW"] = "off"  # rows of m <= 8192 on the wide instance
    if op == "indexer_topk":  # the fused path half the time (by default the unfused one runs)
        switches["JAX_TOPK_INDEXER_TOPK"] = "fused" if rng.random() < 0.5 else "unfused"
    case = Case(index, op, dtype, rows, n, k, bool(rng.random() < 0.5), _pick(rng, kinds),
                row_families, switches)  # fmt: skip
    if op in ("topk_bf16", "topk_filtered", "indexer_topk"):
        case.paged = bool(rng.random() < 0.15)
        if rng.random() < 0.15:
            case.num_valid_rows = int(rng.integers(-1, rows + 2))
    if op == "top_k":
        case.two_axes = rows % 2 == 0 and bool(rng.random() < 0.3)
    if op == "merge_topk":  # up to 8 lists (the register kernel), or up to 64 (the block kernel)
        case.lists = min(int(rng.integers(1, 9 if rng.random() < 0.85 else 65)), n)
        if case.lists > 8:  # columns enough for lists of about k: past the register kernel's
            case.n = n = min(max(n, case.lists * k), max_elements)
            case.rows = rows = max(1, min(rows, max_elements // n))
        case.per_list = max(1, min(2048, int(rng.integers(k, 2 * k + 1)), n // case.lists))
        case.rank_order = bool(rng.random() < 0.5)
        case.k = min(k, case.lists * case.per_list)
    if op == "indexer_topk":  # bfloat16 or float8 q and keys of H = 64, D = 128
        case.dtype = "float8_e4m3fn" if rng.random() < 0.3 else "bfloat16"
        case.families = [_pick(rng, INDEXER_FAMILIES)]
        case.n = min(n, max(1, max_elements // INDEXER_HEADS))
        case.rows = max(1, min(rows, max_elements // INDEXER_HEADS // case.n))
        case.lengths_kind = _pick(rng, ["full", "edges", "causal"])
        if case.num_valid_rows is not None:
            case.num_valid_rows = min(case.num_valid_rows, case.rows + 1)
    else:  # a built family the row cannot hold is recorded as what the row gets
        case.families = [
            f if f not in BUILT_ROWS or BUILT_ROWS[f][0](case.n, case.k) else "heavy_ties"
            for f in case.families
        ]
    return case


def _scores(rng, case: Case) -> np.ndarray:
    """[rows, n] of the case's families, one block of consecutive rows each; sometimes a row
    copied onto another (equal rows)."""
    dtype = DTYPES[case.dtype]
    blocks = np.array_split(np.arange(case.rows), len(case.families))
    out = np.empty((case.rows, case.n), dtype)
    for family, block in zip(case.families, blocks):
        if len(block) == 0:
            continue
        with warnings.catch_warnings():  # float16's ascending rows overflow to inf: wanted
            warnings.simplefilter("ignore", RuntimeWarning)
            if family in families.FAMILIES:
                out[block] = families.make(family, rng, (len(block), case.n), dtype)
            else:
                made = BUILT_ROWS[family][1](rng, len(block), case.n, case.k, dtype)
                out[block] = np.asarray(made).astype(dtype)
    if case.rows > 2 and rng.random() < 0.3:
        out[rng.integers(0, case.rows)] = out[rng.integers(0, case.rows)]
    return out


def _lengths(rng, case: Case) -> np.ndarray | None:
    n, rows = case.n, case.rows
    if case.lengths_kind == "none":
        return None
    if case.lengths_kind == "full":
        return np.full(rows, n, np.int32)
    if case.lengths_kind == "causal":
        return (n - (rows - 1 - np.arange(rows))).astype(np.int32)
    if case.lengths_kind == "edges":
        return rng.permutation(families.edge_lengths(case.k, n, rows, rng)).astype(np.int32)
    return rng.integers(0, n + 2, size=rows).astype(np.int32)


def _paging(rng, case: Case) -> dict:
    """The page-table and num_valid_rows arguments of a paged or masked case."""
    out = {}
    if case.paged:
        page_size = int(2 ** rng.integers(0, 8))
        pages = -(-case.n // page_size)
        tables = int(rng.integers(1, 6))
        table = np.stack([rng.permutation(4 * pages)[:pages] for _ in range(tables)])
        table[:, rng.integers(0, pages)] = -1  # an unmapped page
        out.update(page_table=table.astype(np.int32), page_size=page_size)
        if rng.random() < 0.5:
            out["table_rows"] = rng.integers(-2, tables + 2, size=case.rows).astype(np.int32)
        else:  # a table row a score row
            out["page_table"] = np.resize(out["page_table"], (case.rows, pages))
    if case.num_valid_rows is not None:
        out["num_valid_rows"] = np.int32(case.num_valid_rows)
    return out


def _merge_lists(rng, case: Case, scores: np.ndarray):
    """Each row's candidate lists of distinct columns, of unequal fill with -1 entries (garbage
    values in them), shuffled or each in rank order; and their union as a dense row (NaN off
    the lists) for top_k."""
    rows, n = scores.shape
    m = case.lists * case.per_list
    values = families.make("infinities", rng, (rows, m), scores.dtype)
    indices = np.full((rows, m), -1, np.int32)
    union = np.full((rows, n), np.nan, np.float32).astype(scores.dtype)
    for r in range(rows):
        columns = rng.permutation(n)[:m]
        for j in range(case.lists):
            full = rng.random() < 0.6
            fill = case.per_list if full else int(rng.integers(0, case.per_list + 1))
            filled = slice(j * case.per_list, j * case.per_list + fill)
            indices[r, filled] = columns[filled]
        if not case.rank_order:
            indices[r] = indices[r, rng.permutation(m)]
        present = indices[r] >= 0
        values[r, present] = scores[r, indices[r, present]]
        union[r, indices[r, present]] = values[r, present]
        if case.rank_order:
            values[r], indices[r] = in_rank_order(values[r], indices[r], case.lists)
    return values, indices, union


def _on(backend, fn, *arrays):
    """run_on's results as a tuple (one result or several)."""
    out = run_on(backend, fn, *arrays)
    return out if isinstance(out, tuple) else (out,)


def _as_reference_rows(scores):
    """float16 as float32 for reference_topk, which reads every row but bfloat16 as float32
    bits (the widening is exact and keeps the order and NaN)."""
    return scores.astype(np.float32) if scores.dtype == families.F16 else scores


def run_case(case: Case, seed: int, backend: str):
    """(actual, expected, arrays) of one case: `backend` against its reference."""
    rng = np.random.default_rng([seed, case.index, 1])
    if case.op == "indexer_topk":
        return _indexer_case(rng, case, backend)
    gpu = backend == "gpu"
    scores = _scores(rng, case)
    lengths = _lengths(rng, case)
    arrays = {"scores": scores, "lengths": lengths}
    with kernel_switches(**case.switches):
        if case.op == "top_k":
            if case.two_axes:
                scores = scores.reshape(2, case.rows // 2, case.n)
                lengths = None if lengths is None else lengths.reshape(2, case.rows // 2)
            args = (scores,) if lengths is None else (scores, lengths)

            def call(x, *given):
                return jax_topk.top_k(x, case.k, lengths=given[0] if given else None,
                                      sorted=case.sorted)  # fmt: skip

            actual = _on(backend, call, *args)
            expected = (
                _on("cpu", call, *args)
                if gpu
                else reference_top_k(scores, case.k, lengths, case.sorted)
            )
        elif case.op == "merge_topk":
            values, indices, union = _merge_lists(rng, case, scores)
            arrays.update(values=values, indices=indices)

            def call(v, i):
                return jax_topk.merge_topk(v, i, case.k, sorted=case.sorted)

            actual = _on(backend, call, values, indices)
            expected = (
                _on("cpu", call, values, indices)
                if gpu
                else reference_top_k(union, case.k, None, case.sorted)
            )
        else:
            paging = _paging(rng, case)
            arrays.update(paging)
            page_size = paging.pop("page_size", 1)
            traced_names = list(paging)
            select = getattr(jax_topk, case.op)

            def call(x, given, *traced):
                return select(x, given, k=case.k, sorted=case.sorted, page_size=page_size,
                              **dict(zip(traced_names, traced)))  # fmt: skip

            actual = _on(backend, call, scores, lengths, *paging.values())
            expected = (
                _on("cpu", call, scores, lengths, *paging.values())
                if gpu
                else (
                    reference_topk(
                        _as_reference_rows(scores),
                        lengths,
                        case.k,
                        sorted=case.sorted,
                        page_size=page_size,
                        **paging,
                    ),
                )  # fmt: skip
            )
    return actual, expected, arrays


def _indexer_case(rng, case: Case, backend: str):
    """indexer_topk against topk_filtered of indexer_logits, both on `backend`."""
    dtype = FP8 if case.dtype == "float8_e4m3fn" else families.BF16
    q, keys, weights = make_inputs(rng, case.rows, INDEXER_HEADS, INDEXER_DIM, case.n,
                                   family=case.families[0], dtype=dtype)  # fmt: skip
    key_scales = rng.uniform(0.01, 2.0, size=case.n).astype(np.float32) if dtype == FP8 else None
    lengths = _lengths(rng, case)
    paging = _paging(rng, case)
    page_size = paging.pop("page_size", 1)
    traced_names = list(paging)
    arrays = {"q": q, "keys": keys, "weights": weights, "lengths": lengths} | paging
    fp8 = () if key_scales is None else (key_scales,)
    arrays.update({"key_scales": key_scales} if fp8 else {})

    def fused(q, keys, weights, lengths, *rest):
        scales, traced = (rest[0], rest[1:]) if fp8 else (None, rest)
        return jax_topk.indexer_topk(q, keys, weights, lengths, k=case.k, sorted=case.sorted,
                                     key_scales=scales, page_size=page_size,
                                     **dict(zip(traced_names, traced)))  # fmt: skip

    def unfused(q, keys, weights, lengths, *rest):
        scales, traced = (rest[0], rest[1:]) if fp8 else (None, rest)
        logits = jax_topk.indexer_logits(q, keys, weights, lengths, key_scales=scales)
        return jax_topk.topk_filtered(logits, lengths, k=case.k, sorted=case.sorted,
                                      page_size=page_size,
                                      **dict(zip(traced_names, traced)))  # fmt: skip

    args = (q, keys, weights, lengths, *fp8, *paging.values())
    with kernel_switches(**case.switches):
        actual = _on(backend, fused, *args)
        expected = _on(backend, unfused, *args)
    return actual, expected, arrays


def _first_difference(actual, expected) -> str:
    """'' when every output has the same dtype, shape and bits; else where they first differ."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs against {len(expected)}"
    for which, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {which}: {a.dtype}{a.shape} against {e.dtype}{e.shape}"
        bits = f"uint{a.dtype.itemsize * 8}"
        differ = a.view(bits) != e.view(bits)
        if differ.any():
            where = tuple(int(i) for i in np.argwhere(differ)[0])
            row = where[:-1]
            return (
                f"output {which}: {int(differ.sum())} entries differ, first at {where}; "
                f"row {row}: got {a[row][:8]}..., want {e[row][:8]}..."
            )
    return ""


def runs_only_xla_sort(case: Case) -> bool:
    """A top_k case that top_k sends to its exact sort path (jax_topk/_top_k.py `route`): XLA's
    own sort, no kernel of ours. DTYPES holds only the kernels' own types, which top_k does not
    widen, so the case's dtype is the one `route` sees (tested against top_k's calls)."""
    if case.op != "top_k":
        return False
    chosen = top_k_route(DTYPES[case.dtype], case.n, case.k, case.rows)
    return chosen is TopKRoute.SORT


def fuzz(
    seconds: float,
    cases: int | None,
    seed: int,
    out: Path | None,
    only: int | None = None,
    log=print,
    max_elements: int = MAX_ELEMENTS,
    first: int = 0,
    announce: bool = False,
    skip_xla_sort: bool = False,
):
    """Runs cases first, first + 1, ... until `seconds` or `cases` run out (`only`: that case
    alone), leaving out those of XLA's sort path where asked (runs_only_xla_sort); returns
    (cases run, the cases that differ)."""
    backend = "gpu" if gpu_devices() else "cpu"
    reference = "the CPU handler" if backend == "gpu" else "NumPy"
    kernels = "CUDA kernels" if HAS_CUDA_EXTENSION else "no CUDA extension"
    log(
        f"fuzz: seed {seed}, cases from {only if only is not None else first}, max elements "
        f"{max_elements}, {backend} ({kernels}) against {reference}"
    )
    start = last = time.monotonic()
    counts: dict[str, int] = {}
    skipped = 0
    failures = []
    last_index = first + cases if cases is not None else 2**62
    indices = [only] if only is not None else range(first, last_index)
    for index in indices:
        if only is None and time.monotonic() - start >= seconds:
            break
        case = make_case(seed, index, max_elements)
        if skip_xla_sort and only is None and runs_only_xla_sort(case):  # a replay always runs
            skipped += 1
            if announce:
                log(f"skipping {case.label()}: XLA's sort path")
            continue
        if announce:
            log(f"running {case.label()}")
        try:
            actual, expected, arrays = run_case(case, seed, backend)
            problem = _first_difference(actual, expected)
        except Exception as error:  # a crash or a launch failure is a finding too
            arrays, problem = {}, f"raised {type(error).__name__}: {error}"
        counts[case.op] = counts.get(case.op, 0) + 1
        if problem:
            failures.append(case)
            log(f"MISMATCH {case.label()}: {problem}")
            if out is not None:
                _write_failure(out, case, seed, max_elements, problem, arrays)
        if time.monotonic() - last > 15:
            last = time.monotonic()
            log(f"  {last - start:5.0f} s: {sum(counts.values())} cases {counts}, "
                f"{len(failures)} differ")  # fmt: skip
    total = sum(counts.values())
    left_out = f" ({skipped} of XLA's sort path left out)" if skipped else ""
    log(
        f"fuzz: {total} cases in {time.monotonic() - start:.0f} s {counts}, "
        f"{len(failures)} differ{left_out}"
    )
    return total, failures


def _write_failure(out: Path, case: Case, seed: int, max_elements: int, problem: str, arrays):
    out.mkdir(parents=True, exist_ok=True)
    record = dataclasses.asdict(case) | {
        "seed": seed,
        "max_elements": max_elements,
        "problem": problem,
    }
    with open(out / "failures.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    present = {name: value for name, value in arrays.items() if value is not None}
    np.savez_compressed(out / f"case-{seed}-{case.index}.npz", **present)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--first", type=int, default=0, help="the index of the first case")
    parser.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--case", type=int, default=None, help="replay one case of the seed")
    parser.add_argument("--out", type=Path, default=None, help="where mismatches are written")
    parser.add_argument(
        "--max-elements",
        type=int,
        default=MAX_ELEMENTS,
        help="a case's scores at most (small under compute-sanitizer; replay with the same)",
    )
    parser.add_argument("--require-gpu", action="store_true", help="fail without a GPU")
    parser.add_argument("--announce", action="store_true", help="print each case before it runs")
    parser.add_argument(
        "--skip-xla-sort",
        action="store_true",
        help="leave out top_k cases of its sort path (XLA's kernels only; under memcheck)",
    )
    args = parser.parse_args(argv)
    if args.require_gpu and not (gpu_devices() and HAS_CUDA_EXTENSION):
        print(f"fuzz: --require-gpu, but GPUs {gpu_devices()}, CUDA extension "
              f"{HAS_CUDA_EXTENSION}", flush=True)  # fmt: skip
        return 2
    total, failures = fuzz(
        args.seconds,
        args.cases,
        args.seed,
        args.out,
        args.case,
        lambda line: print(line, flush=True),
        args.max_elements,
        args.first,
        args.announce,
        args.skip_xla_sort,
    )
    return 1 if failures or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
