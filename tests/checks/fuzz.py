"""Differential fuzzing of the kernels: random calls of every selecting operator, each row of
its own adversarial value family, shapes and k near the dispatch boundaries, lengths at every
edge, page tables and num_valid_rows, and the dispatch switches forced at random. Each GPU
result is compared with the CPU handler's, bit for bit (indices and values); indexer_topk with
topk_filtered of indexer_logits on the same backend (their logits are not bit-equal across
backends). Without a GPU the CPU handler is compared with the NumPy contract instead, which
exercises the generator (tests/test_fuzz_check.py runs that way in CI).

    python -m tests.checks.fuzz [--seconds 240] [--cases N] [--seed S] [--case I] [--out DIR]
                                [--max-elements E]

Under compute-sanitizer (out-of-bounds accesses at random shapes), a small --max-elements keeps
each case quick: `compute-sanitizer --error-exitcode 9 python -m tests.checks.fuzz
--max-elements 100000`.

A case is a function of (seed, index) alone: `--seed S --case I` replays one. Progress goes to
stdout every 15 s; each mismatch is written to DIR/failures.jsonl with its case, and its arrays
to DIR/case-I.npz. Exit status 1 if any case differs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import warnings
from pathlib import Path

# Forced dispatch switches are read by the handlers at each launch; a call replayed from a
# captured command buffer would keep the switches of its capture.
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jax_topk  # noqa: E402
from tests.support import families  # noqa: E402
from tests.support.indexer import make_inputs  # noqa: E402
from tests.support.operators import device_for, gpu_devices  # noqa: E402
from tests.support.reference import reference_topk  # noqa: E402
from tests.test_gpu_stress import one_coarse_bin, sample_foolers, tied_group_rows  # noqa: E402

DTYPES = {"float32": families.F32, "bfloat16": families.BF16, "float16": families.F16}
# Widths on either side of the routes' limits: small rows (<= 1024), the register and argmax
# kernels (16384), the filtered kernel's shared candidates (8192), the cluster kernels'
# registers (32768 to 262144), vocabulary rows.
WIDTHS = [1, 2, 31, 33, 255, 256, 257, 1000, 1024, 1025, 2047, 2048, 2049, 4096, 4097, 8191,
          8192, 8193, 12345, 16383, 16384, 16385, 32767, 32768, 32769, 65536, 65537, 131072,
          152064, 196608, 262144, 262145]  # fmt: skip
KS = [1, 2, 7, 8, 16, 17, 32, 33, 50, 64, 65, 256, 257, 512, 1024, 1500, 2047, 2048]
ROW_COUNTS = [1, 2, 3, 4, 5, 8, 13, 31, 32, 33, 64, 100, 131, 132, 133, 200, 264, 265, 700]
MAX_ELEMENTS = 6_000_000  # a case's scores (the CPU handler's time, the NumPy reference's)
# Dispatch switches (read by the CUDA handlers at each launch), each with the values a case may
# force; none of them changes a result, only the kernel that computes it.
SWITCHES = {
    "JAX_TOPK_F32_CLUSTER": ["off", "always"],
    "JAX_TOPK_FILTERED_SPLIT": ["off"],
    "JAX_TOPK_F32_ROWS": ["off", "always", "wide", "many"],
    "JAX_TOPK_SMALL_ROWS": ["digits"],
    "JAX_TOPK_ARGMAX": ["off", "always"],
    "JAX_TOPK_SHORT_16BIT": ["own"],
    "JAX_TOPK_BF16_SORT": ["radix"],
    "JAX_TOPK_MERGE_NARROW": ["off"],
    "JAX_TOPK_INDEXER_TOPK": ["fused", "unfused"],
}
# Rows built against a kernel's steps (tests/support/families.py, tests/test_gpu_stress.py): the
# rows' width and k they need, and the maker (rng, rows, n, k, dtype).
BUILT_ROWS = {
    "kth_key_at_the_cutoff": (
        lambda n, k: n > k + 6000,
        families.kth_key_at_the_cutoff,
    ),
    "few_keys_over_a_span": (
        lambda n, k: k >= 2048 and n >= 4 * k,
        families.few_keys_over_a_span,
    ),
    "sample_foolers": (
        lambda n, k: True,
        lambda rng, rows, n, k, dtype: sample_foolers(rng, rows, n),
    ),
    "one_coarse_bin": (
        lambda n, k: True,
        lambda rng, rows, n, k, dtype: one_coarse_bin(rng, rows, n),
    ),
    "tied_group": (
        lambda n, k: k > 16 and n >= k + 40,
        lambda rng, rows, n, k, dtype: tied_group_rows(rng, rows, n, k, _pick(rng, [2, 32, 33])),
    ),
}
OP_WEIGHTS = {"top_k": 4, "topk_filtered": 3, "topk_bf16": 2, "merge_topk": 2, "indexer_topk": 1}


@dataclasses.dataclass
class Case:
    index: int
    op: str
    dtype: str
    rows: int
    n: int
    k: int
    sorted: bool
    lengths: str  # "none" (top_k only), "full", "edges", "causal", "random"
    families: list[str]  # a family for each block of rows
    switches: dict[str, str]
    paged: bool = False
    num_valid_rows: int | None = None

    def label(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.switches.items())
        extra = " paged" * self.paged + (
            f" valid={self.num_valid_rows}" if self.num_valid_rows is not None else ""
        )
        return (
            f"#{self.index} {self.op} {self.dtype} {self.rows}x{self.n} k={self.k} "
            f"sorted={self.sorted} lengths={self.lengths}{extra} {env}".rstrip()
        )


def _pick(rng, options):
    return options[int(rng.integers(0, len(options)))]


def _width(rng, large: bool) -> int:
    if rng.random() < 0.6:
        widths = [w for w in WIDTHS if (w > 20000) == large]
        return _pick(rng, widths)
    return int(rng.integers(20001, 300000)) if large else int(rng.integers(1, 20001))


def make_case(seed: int, index: int, max_elements: int = MAX_ELEMENTS) -> Case:
    """Case `index` of `seed`, its scores at most `max_elements` (a smaller bound shrinks the
    widths and row counts drawn: the cases then differ from the default bound's)."""
    rng = np.random.default_rng([seed, index])
    ops = list(OP_WEIGHTS)
    weights = np.array([OP_WEIGHTS[o] for o in ops], float)
    op = ops[int(rng.choice(len(ops), p=weights / weights.sum()))]
    dtype = "bfloat16" if op == "topk_bf16" else _pick(rng, list(DTYPES))
    large = op != "topk_bf16" and rng.random() < 0.3
    n = min(_width(rng, large), 16384) if op == "topk_bf16" else _width(rng, large)
    rows = _pick(rng, ROW_COUNTS)
    n = min(n, max_elements)
    rows = max(1, min(rows, max_elements // n))
    if op == "top_k":
        k = _pick(rng, KS + [n, n - 1, 2049, 3000, 4096]) if rng.random() < 0.8 else None
        k = int(rng.integers(1, n + 1)) if k is None else k
        k = max(1, min(k, n))
    elif op == "merge_topk":
        k = _pick(rng, KS)
    else:
        k = _pick(rng, KS) if rng.random() < 0.85 else int(rng.integers(1, 2049))
    lengths = _pick(rng, ["full", "edges", "causal", "random"] + ["none"] * (op == "top_k") * 2)
    names = sorted(families.FAMILIES) + sorted(BUILT_ROWS) * 2
    row_families = [_pick(rng, names) for _ in range(int(rng.integers(1, 5)))]
    switches = {}
    if rng.random() < 0.5:
        for name in rng.choice(sorted(SWITCHES), size=int(rng.integers(1, 3)), replace=False):
            switches[str(name)] = _pick(rng, SWITCHES[str(name)])
    case = Case(index, op, dtype, rows, n, k, bool(rng.random() < 0.5), lengths, row_families,
                switches)  # fmt: skip
    if op in ("topk_bf16", "topk_filtered"):
        case.paged = bool(rng.random() < 0.15)
        if rng.random() < 0.15:
            case.num_valid_rows = int(rng.integers(-1, rows + 2))
    if op == "indexer_topk":  # H = 64, D = 128: keep the CPU's logits quick
        case.dtype, case.rows, case.n = "bfloat16", min(rows, 8), min(n, 12000)
        case.lengths = _pick(rng, ["full", "edges", "causal"])
    return case


def _scores(rng, case: Case) -> np.ndarray:
    """[rows, n] of the case's families, one block of consecutive rows each; some rows copied
    onto others (equal rows)."""
    dtype = DTYPES[case.dtype]
    blocks = np.array_split(np.arange(case.rows), len(case.families))
    out = np.empty((case.rows, case.n), dtype)
    for family, block in zip(case.families, blocks):
        if len(block) == 0:
            continue
        with warnings.catch_warnings():  # float16's ascending rows overflow to inf: wanted
            warnings.simplefilter("ignore", RuntimeWarning)
            out[block] = _family_rows(rng, case, family, len(block), dtype)
    if case.rows > 2 and rng.random() < 0.3:
        out[rng.integers(0, case.rows)] = out[rng.integers(0, case.rows)]
    return out


def _family_rows(rng, case: Case, family: str, rows: int, dtype) -> np.ndarray:
    if family in families.FAMILIES:
        return families.make(family, rng, (rows, case.n), dtype)
    fits, make = BUILT_ROWS[family]
    if not fits(case.n, case.k):  # the row too short for its family
        return families.make("heavy_ties", rng, (rows, case.n), dtype)
    return np.asarray(make(rng, rows, case.n, case.k, dtype)).astype(dtype)


def _lengths(rng, case: Case) -> np.ndarray | None:
    n, rows = case.n, case.rows
    if case.lengths == "none":
        return None
    if case.lengths == "full":
        return np.full(rows, n, np.int32)
    if case.lengths == "causal":
        return (n - (rows - 1 - np.arange(rows))).astype(np.int32)
    if case.lengths == "edges":
        return rng.permutation(families.edge_lengths(case.k, n, rows, rng)).astype(np.int32)
    return rng.integers(0, n + 2, size=rows).astype(np.int32)


def _paging(rng, case: Case) -> dict:
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
        elif tables != case.rows:
            out["page_table"] = np.resize(out["page_table"], (case.rows, pages))
    if case.num_valid_rows is not None:
        out["num_valid_rows"] = np.int32(case.num_valid_rows)
    return out


def _merge_lists(rng, scores: np.ndarray, k: int):
    """Candidate lists of distinct columns per row, lists of unequal fill with -1 entries
    (garbage values in them), shuffled or in rank order; and the union as a dense row (NaN off
    the lists) for top_k."""
    rows, n = scores.shape
    lists = min(int(rng.integers(1, 9)), n)
    per_list = int(max(1, min(2048, rng.integers(k, 2 * k + 1), n // lists)))
    m = lists * per_list
    values = families.make("infinities", rng, (rows, m), scores.dtype)
    indices = np.full((rows, m), -1, np.int32)
    union = np.full((rows, n), np.nan, np.float32).astype(scores.dtype)
    ordered = rng.random() < 0.5
    for r in range(rows):
        columns = rng.permutation(n)[:m]
        for j in range(lists):
            fill = per_list if rng.random() < 0.6 else int(rng.integers(0, per_list + 1))
            filled = slice(j * per_list, j * per_list + fill)
            indices[r, filled] = columns[filled]
        if not ordered:
            indices[r] = indices[r, rng.permutation(m)]
        present = indices[r] >= 0
        values[r, present] = scores[r, indices[r, present]]
        union[r, indices[r, present]] = values[r, present]
    return values, indices, union, min(k, m)


@contextlib.contextmanager
def _environment(switches: dict[str, str]):
    saved = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _on(backend, fn, *arrays, **static):
    """fn under a fresh jit on one backend (a fresh compile: the switches apply)."""
    device = device_for(backend)
    placed = jax.device_put(arrays, device)
    out = jax.jit(lambda *a: fn(*a, **static))(*placed)
    return tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))


def _widened16(scores):
    """float16 as float32 (exact, order and NaN kept) for reference_topk, which reads 16-bit
    rows as bfloat16."""
    return scores.astype(np.float32) if scores.dtype == families.F16 else scores


def _numpy_top_k(operand, k, lengths, sorted_):
    from tests.test_top_k import reference_top_k

    return reference_top_k(operand, k, lengths, sorted_)


def run_case(case: Case, seed: int, backend: str):
    """(actual, expected, arrays) of one case: `backend` against its reference."""
    rng = np.random.default_rng([seed, case.index, 1])
    gpu = backend == "gpu"
    if case.op == "indexer_topk":
        return _indexer_case(rng, case, backend)
    scores = _scores(rng, case)
    lengths = _lengths(rng, case)
    arrays = {"scores": scores, "lengths": lengths}
    with _environment(case.switches):
        if case.op == "top_k":
            fn = lambda x, *lens: jax_topk.top_k(  # noqa: E731
                x, case.k, lengths=lens[0] if lens else None, sorted=case.sorted
            )
            if case.rows % 2 == 0 and rng.random() < 0.3:  # a leading shape of two axes
                scores = scores.reshape(2, case.rows // 2, case.n)
                lengths = None if lengths is None else lengths.reshape(2, case.rows // 2)
            args = (scores,) if lengths is None else (scores, lengths)
            actual = _on(backend, fn, *args)
            expected = (
                _on("cpu", fn, *args) if gpu else _numpy_top_k(scores, case.k, lengths, case.sorted)
            )
        elif case.op == "merge_topk":
            values, indices, union, k = _merge_lists(rng, scores, case.k)
            arrays.update(values=values, indices=indices)
            fn = lambda v, i: jax_topk.merge_topk(v, i, k, sorted=case.sorted)  # noqa: E731
            actual = _on(backend, fn, values, indices)
            expected = (
                _on("cpu", fn, values, indices)
                if gpu
                else _numpy_top_k(union, k, None, case.sorted)
            )
        else:
            paging = _paging(rng, case)
            arrays.update(paging)
            op = getattr(jax_topk, case.op)
            names = list(paging)
            fn = lambda x, lens, *traced: op(  # noqa: E731
                x, lens, k=case.k, sorted=case.sorted, **dict(zip(names, traced)),
                **({"page_size": paging["page_size"]} if "page_size" in paging else {}),
            )  # fmt: skip
            traced = [paging[name] for name in names if name != "page_size"]
            names = [name for name in names if name != "page_size"]
            actual = _on(backend, fn, scores, lengths, *traced)
            expected = (
                _on("cpu", fn, scores, lengths, *traced)
                if gpu
                else (
                    reference_topk(
                        _widened16(scores), lengths, case.k, sorted=case.sorted, **paging
                    ),
                )  # fmt: skip
            )
    return actual, expected, arrays


def _indexer_case(rng, case: Case, backend: str):
    family = _pick(rng, ["normal", "repeated_keys", "zero_heads", "all_negative", "integers",
                         "periodic", "random_bits"])  # fmt: skip
    q, keys, weights = make_inputs(rng, case.rows, 64, 128, case.n, family=family)
    lengths = _lengths(rng, case)
    with _environment(case.switches):
        fused = _on(
            backend,
            lambda a, b, c, d: jax_topk.indexer_topk(a, b, c, d, k=case.k, sorted=case.sorted),
            q, keys, weights, lengths,
        )  # fmt: skip
        logits = _on(backend, jax_topk.indexer_logits, q, keys, weights, lengths)[0]
        expected = _on(
            backend,
            lambda x, d: jax_topk.topk_filtered(x, d, k=case.k, sorted=case.sorted),
            logits, lengths,
        )  # fmt: skip
    return fused, expected, {"q": q, "keys": keys, "weights": weights, "lengths": lengths}


def _first_difference(actual, expected) -> str:
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


def fuzz(
    seconds: float,
    cases: int | None,
    seed: int,
    out: Path | None,
    only=None,
    log=print,
    max_elements: int = MAX_ELEMENTS,
):
    """Runs cases until `seconds` or `cases` run out; returns (cases run, failures)."""
    backend = "gpu" if gpu_devices() else "cpu"
    reference = "the CPU handler" if backend == "gpu" else "NumPy"
    log(f"fuzz: seed {seed}, {backend} against {reference}")
    start = last = time.monotonic()
    counts: dict[str, int] = {}
    failures = []
    index = 0 if only is None else only
    while True:
        if only is not None and index != only:
            break
        if cases is not None and index >= cases or time.monotonic() - start > seconds:
            break
        case = make_case(seed, index, max_elements)
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
                out.mkdir(parents=True, exist_ok=True)
                record = dataclasses.asdict(case) | {"seed": seed, "problem": problem}
                with open(out / "failures.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
                np.savez_compressed(
                    out / f"case-{case.index}.npz",
                    **{name: v for name, v in arrays.items() if v is not None},
                )
        if time.monotonic() - last > 15:
            last = time.monotonic()
            log(f"  {last - start:5.0f} s: {index + 1} cases {counts}, {len(failures)} differ")
        index += 1
    total = sum(counts.values())
    log(f"fuzz: {total} cases in {time.monotonic() - start:.0f} s {counts}, {len(failures)} differ")
    return total, failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0)
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
    args = parser.parse_args(argv)
    log = lambda line: print(line, flush=True)  # noqa: E731
    _, failures = fuzz(
        args.seconds, args.cases, args.seed, args.out, args.case, log, args.max_elements
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
