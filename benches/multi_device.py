"""The multi-device benchmark (issue 17): one process, every local device, a Mesh.

    python -m benches.multi_device [--quick] [--large] [--ops topk_filtered,top_k]
                                   [--merges all_gather,tree] [--json PATH]

`topk_filtered` and `top_k` (k = 2048) on 5536 x 131072 causal float32 rows (`--large`:
5536 x 524288 too; `--quick`: small rows for the CPU) on 1, 2, 4 and 8 devices (each count
that divides the local devices):
1. rows sharded over a 1-D mesh ("data");
2. columns sharded over a 1-D mesh ("model"), once a way the candidates travel
   (jax_topk/_sharding.py's COLUMN_MERGE: the all-gather, the tree of pairwise merges);
3. both on a 2-D mesh (2 x devices / 2, rows over "data", columns over "model").
For each: the device time of the whole step per device (benches/bench.py's profiler
helpers, collectives included; the slowest device and the mean), the wall time, the
all-gather of the [rows, devices, k] values and columns timed on its own, the result
checked bit-equal to the one-device run, and the HLO check: no collective of the compiled
step moves the scores (an operand larger than a shard's candidates), only the candidates.
`--json PATH` writes the records and a Markdown table beside it with the targets of issue
17. On the CPU (8 host devices: XLA_FLAGS=--xla_force_host_platform_device_count=8) there
is no device clock: the times are wall times, for correctness only.
"""

from __future__ import annotations

import os

# NCCL's NVLink multicast stays off (the device README: it can put a shared host's GPUs out
# of service); these must be set before JAX starts NCCL.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from benches import report  # noqa: E402
from benches import scores as scores_of  # noqa: E402
from benches.bench import (  # noqa: E402
    _same_bits,
    _this_run,
    median_call_us,
    traced_kernel_events,
    wall_time_us,
)
from jax_topk import _sharding, top_k, topk_filtered  # noqa: E402

K = 2048
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
ROW_SPEEDUP_TARGET = 0.95  # of the device count: 1.9x on 2 devices (issue 17)
COLUMN_RATIO_TARGET = 1.2  # of (one-device time / devices) + the candidates' all-gather


@dataclass(frozen=True)
class Problem:
    op: str
    rows: int
    n: int
    k: int
    dtype: str = "float32"

    def lengths(self) -> np.ndarray:
        """Causal: row i of M has length N - (M - 1 - i)."""
        return (self.n - (self.rows - 1 - np.arange(self.rows))).astype(np.int32)

    def call(self):
        k = self.k
        if self.op == "top_k":
            return lambda scores, lengths: top_k(scores, k, lengths=lengths)
        return lambda scores, lengths: topk_filtered(scores, lengths, k=k)


@dataclass(frozen=True)
class Layout:
    """A mesh of `row_shards` x `column_shards` devices; rows over "data", columns over
    "model" (an axis of one device is left out)."""

    row_shards: int
    column_shards: int
    column_merge: str = "all_gather"

    @property
    def devices(self) -> int:
        return self.row_shards * self.column_shards

    @property
    def name(self) -> str:
        if self.devices == 1:
            return "one device"
        parts = [("rows", self.row_shards), ("columns", self.column_shards)]
        return " x ".join(what for what, shards in parts if shards > 1)

    def mesh(self) -> Mesh:
        devices = np.array(jax.devices()[: self.devices]).reshape(
            self.row_shards, self.column_shards
        )
        return Mesh(devices, ("data", "model"))

    def spec(self) -> P:
        return P(
            "data" if self.row_shards > 1 else None, "model" if self.column_shards > 1 else None
        )


def layouts(device_count: int, merges: list[str]) -> list[Layout]:
    """One device; then for each count 2, 4, 8 that divides the local devices: rows, columns
    (each merge) and, from 4 devices, 2 x count / 2 (each merge)."""
    out = [Layout(1, 1)]
    for count in (2, 4, 8):
        if count > device_count or device_count % count:
            continue
        out.append(Layout(count, 1))
        out += [Layout(1, count, merge) for merge in merges]
        if count >= 4:
            out += [Layout(2, count // 2, merge) for merge in merges]
    return out


def problems(ops: list[str], quick: bool, large: bool) -> list[Problem]:
    if quick:
        sizes = [(64, 4096, 64)]  # 512 columns a device on 8: above k, so the HLO check holds
    else:
        sizes = [(5536, 131072, K)] + ([(5536, 524288, K)] if large else [])
    return [Problem(op, rows, n, k) for rows, n, k in sizes for op in ops]


# --- the HLO check ------------------------------------------------------------------------

_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+[\w\-]+\(")
_SHAPE = re.compile(r"\w+\[([\d,]*)\]")


def _elements(shape_text: str) -> int:
    """The largest array's element count in a shape (a tuple's largest member)."""
    sizes = [
        int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
        for dims in _SHAPE.findall(shape_text)
    ]
    return max(sizes, default=0)


def moved_elements(hlo: str) -> list[tuple[str, int]]:
    """(collective, the largest operand's element count) for each collective of a compiled
    module's text (the `-done` halves of async pairs left out); inf where an operand's shape
    is not in the text."""
    shapes = {}
    for line in hlo.splitlines():
        definition = _DEFINITION.match(line)
        if definition:
            shapes[definition.group(1)] = definition.group(2)
    moved = []
    for line in hlo.splitlines():
        op = next((c for c in COLLECTIVES if f" {c}(" in line or f" {c}-start(" in line), None)
        if op is None:
            continue
        arguments = line.split(f" {op}", 1)[1].split("(", 1)[1].split(")", 1)[0]
        operands = re.findall(r"%([\w.\-]+)", arguments)
        # An operand whose shape was not found counts as the largest possible (the check
        # fails rather than passing on what it could not read).
        sizes = [_elements(shapes[o]) if o in shapes else np.inf for o in operands]
        moved.append((op, max(sizes, default=np.inf)))
    return moved


def hlo_check(hlo: str, problem: Problem, layout: Layout) -> tuple[bool, str]:
    """(passed, summary): every collective moves at most a shard's candidates (its rows x k
    a device, values or columns), never the scores (its rows x n / column shards); a
    column-sharded step has such collectives, a row-sharded one none."""
    local_rows = problem.rows // layout.row_shards
    candidates = local_rows * problem.k
    moved = moved_elements(hlo)
    too_large = [(op, size) for op, size in moved if size > candidates]
    kinds = sorted({op for op, _ in moved})
    if layout.column_shards > 1:
        passed = not too_large and bool(moved)
    else:
        passed = not moved
    if too_large:
        summary = f"scores moved: {too_large[:3]}"
    elif moved:
        summary = f"{len(moved)} {'/'.join(kinds)} of candidates only"
    else:
        summary = "no collective"
    return passed, summary


def hlo_check_catches_scores(problem: Problem, layout: Layout) -> bool:
    """The check's own control: it must fail a step that all-gathers the column-sharded
    scores (compiled only, nothing allocated)."""
    mesh = layout.mesh()
    scores = jax.ShapeDtypeStruct(
        (problem.rows, problem.n), problem.dtype, sharding=NamedSharding(mesh, layout.spec())
    )
    whole = NamedSharding(mesh, P(layout.spec()[0], None))
    gathered = jax.jit(lambda s: s * 2, out_shardings=whole).lower(scores).compile()
    passed, _ = hlo_check(gathered.as_text(), problem, layout)
    return not passed


# --- timing -------------------------------------------------------------------------------


def device_times_us(fn, input_sets, calls: int) -> tuple[float | None, float | None]:
    """(the slowest device's, the mean device's) median device time of one step, from the
    profiler; (None, None) without GPU kernels (the CPU, where no trace is taken)."""
    if jax.devices()[0].platform != "gpu":
        return None, None
    by_device = traced_kernel_events(fn, input_sets, calls)
    per_device = [median_call_us(events, calls) for events in by_device.values() if events]
    if not per_device:
        return None, None
    return max(per_device), float(np.mean(per_device))


def candidates_gather(layout: Layout, problem: Problem):
    """(jitted all-gather of [rows, devices, k] values and columns over "model", inputs of
    the step's sharding), or None where the columns are not split."""
    if layout.column_shards == 1:
        return None
    mesh = layout.mesh()
    rows_axis = layout.spec()[0]
    spec = P(rows_axis, "model", None)

    def gather(values, columns):
        return tuple(jax.lax.all_gather(x, "model", axis=1, tiled=True) for x in (values, columns))

    fn = jax.jit(
        jax.shard_map(
            gather,
            mesh=mesh,
            in_specs=(spec, spec),
            out_specs=P(rows_axis, None, None),
            check_vma=False,  # an all-gather's result is the same on every device of "model"
        )
    )
    shape = (problem.rows, layout.column_shards, problem.k)
    sharding = NamedSharding(mesh, spec)
    values = jax.device_put(jnp.zeros(shape, problem.dtype), sharding)
    columns = jax.device_put(jnp.zeros(shape, jnp.int32), sharding)
    return fn, (values, columns)


@dataclass(frozen=True)
class Plan:
    sets: int  # distinct input sets (rows of GB: two suffice to leave the L2)
    calls: int  # traced calls
    wall_repeats: int

    @staticmethod
    def of(problem: Problem, quick: bool) -> Plan:
        one_set = problem.rows * problem.n * jnp.dtype(problem.dtype).itemsize
        return Plan(1 if one_set > (4 << 30) else 2, 3 if quick else 10, 3 if quick else 10)


def make_sets(problem: Problem, sets: int) -> list[tuple]:
    """Random normal scores and causal lengths, on the first device (the sharded copies are
    made from these, so every layout sees the same bits)."""
    lengths = jnp.asarray(problem.lengths())
    key = jax.random.key(problem.rows * 7 + problem.n)
    normal = jax.jit(lambda key: scores_of.normal(key, (problem.rows, problem.n), problem.dtype))
    return [(normal(jax.random.fold_in(key, i)), lengths) for i in range(sets)]


def same_results(got, want) -> bool:
    """Every array of a result (indices; top_k's values too) the same bits."""
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    return len(got) == len(want) and all(_same_bits(g, w) for g, w in zip(got, want))


def bench_layout(problem: Problem, layout: Layout, host_sets, reference, quick: bool) -> dict:
    plan = Plan.of(problem, quick)
    mesh = layout.mesh()
    scores_sharding = NamedSharding(mesh, layout.spec())
    lengths_sharding = NamedSharding(mesh, P(layout.spec()[0]))
    input_sets = [
        (jax.device_put(s, scores_sharding), jax.device_put(lens, lengths_sharding))
        for s, lens in host_sets
    ]
    _sharding.COLUMN_MERGE = layout.column_merge
    jax.clear_caches()  # the merge is chosen when a call is partitioned
    step = jax.jit(problem.call())
    compiled = step.lower(*input_sets[0]).compile()
    hlo_passed, hlo_summary = hlo_check(compiled.as_text(), problem, layout)
    equal = same_results(compiled(*input_sets[0]), reference)
    device_us, device_mean_us = device_times_us(compiled, input_sets, plan.calls)
    wall_us = wall_time_us(problem.call(), input_sets, plan.wall_repeats)
    gather_us = gather_wall_us = None
    gather = candidates_gather(layout, problem)
    if gather is not None:
        gather_fn, gather_inputs = gather
        gather_us, _ = device_times_us(gather_fn, [gather_inputs], plan.calls)
        gather_wall_us = wall_time_us(gather_fn, [gather_inputs], plan.wall_repeats)
    del input_sets
    return dict(
        op=problem.op,
        dtype=problem.dtype,
        rows=problem.rows,
        n=problem.n,
        k=problem.k,
        lengths="causal",
        layout=layout.name,
        mesh=f"{layout.row_shards}x{layout.column_shards}",
        devices=layout.devices,
        column_merge=layout.column_merge if layout.column_shards > 1 else None,
        device_us=device_us,
        device_mean_us=device_mean_us,
        wall_us=wall_us,
        gather_us=gather_us,
        gather_wall_us=gather_wall_us,
        equal_to_one_device=equal,
        hlo_passed=hlo_passed,
        hlo=hlo_summary,
        local_devices=jax.local_device_count(),
        **_this_run(),
    )


# --- the report ---------------------------------------------------------------------------


def step_us(record: dict) -> float:
    """The time the targets compare: device time (the slowest device) where measured, else
    wall time (the CPU)."""
    return record["device_us"] if record["device_us"] is not None else record["wall_us"]


def gather_time_us(record: dict) -> float | None:
    return record["gather_us"] if record["gather_us"] is not None else record["gather_wall_us"]


def with_targets(records: list[dict]) -> list[dict]:
    """Each record with issue 17's targets against the one-device record of its problem:
    rows sharded, `row_speedup` (one-device time / time) against 0.95 x devices; columns
    sharded (alone or with rows), `column_ratio`, time / ((one-device time / devices) +
    the candidates' all-gather), against 1.2."""
    single = {
        (r["op"], r["rows"], r["n"], r["k"]): step_us(r) for r in records if r["devices"] == 1
    }
    out = []
    for record in records:
        one = single.get((record["op"], record["rows"], record["n"], record["k"]))
        record = dict(record, row_speedup=None, row_target=None, column_ratio=None)
        if one is not None and record["devices"] > 1:
            if record["layout"] == "rows":
                record["row_speedup"] = one / step_us(record)
                record["row_target"] = ROW_SPEEDUP_TARGET * record["devices"]
            else:
                bound = one / record["devices"] + (gather_time_us(record) or 0.0)
                record["column_ratio"] = step_us(record) / bound
        out.append(record)
    return out


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(records: list[dict]) -> str:
    lines = [
        "| op | rows x n | mesh | layout | merge | device us (slowest / mean device) | wall us "
        "| candidates' all-gather us "
        f"| row speedup (target) | column ratio (target <= {COLUMN_RATIO_TARGET}) "
        "| equal to one device | HLO check |",
        "|" + " --- |" * 12,
    ]
    for r in with_targets(records):
        time = "-"
        if r["device_us"] is not None:
            time = f"{_fmt(r['device_us'])} / {_fmt(r['device_mean_us'])}"

        def verdict(met: bool) -> str:  # no verdict on wall times of host devices
            return ("met" if met else "missed") if r["device_us"] is not None else "CPU wall"

        speedup = "-"
        if r["row_speedup"] is not None:
            met = verdict(r["row_speedup"] >= r["row_target"])
            speedup = f"{r['row_speedup']:.2f}x (>= {r['row_target']:.2f}x: {met})"
        ratio = "-"
        if r["column_ratio"] is not None:
            ratio = f"{r['column_ratio']:.2f} ({verdict(r['column_ratio'] <= COLUMN_RATIO_TARGET)})"
        lines.append(
            f"| {r['op']} | {r['rows']}x{r['n']} | {r['mesh']} | {r['layout']} "
            f"| {r['column_merge'] or '-'} | {time} | {_fmt(r['wall_us'])} "
            f"| {_fmt(gather_time_us(r))} | {speedup} | {ratio} "
            f"| {'yes' if r['equal_to_one_device'] else 'NO'} "
            f"| {'passed' if r['hlo_passed'] else 'FAILED'}: {r['hlo']} |"
        )
    return "\n".join(lines)


def write_markdown(records: list[dict], json_path: str, command: str) -> str:
    path = os.path.splitext(json_path)[0] + ".md"
    first = records[0]
    text = (
        f"# Multi-device top-k: {first['local_devices']} x {first['device']}\n\n"
        f"`{command}` (jax {first['jax']}, {first['date']}). "
        "Rows sharded over `data`, columns over `model`; k = "
        f"{first['k']}, causal lengths. Targets (issue 17): rows sharded, throughput >= "
        f"{ROW_SPEEDUP_TARGET} x devices the one-device run's; columns sharded, the step within "
        f"{COLUMN_RATIO_TARGET}x of (one-device time / devices) + the candidates' all-gather "
        "(timed alone: [rows, devices, k] values and columns). benches/README.md says how "
        "time is measured.\n\n" + format_table(records) + "\n"
    )
    with open(path, "w") as f:
        f.write(text)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benches.multi_device",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ops", default="topk_filtered,top_k")
    parser.add_argument(
        "--merges",
        default=",".join(_sharding.COLUMN_MERGES),
        help="how column-sharded candidates travel (jax_topk/_sharding.py's COLUMN_MERGE)",
    )
    parser.add_argument("--quick", action="store_true", help="small rows (the CPU)")
    parser.add_argument("--large", action="store_true", help="5536 x 524288 too")
    parser.add_argument("--json", metavar="PATH", help="write the records and a .md beside")
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    merges = args.merges.split(",")
    if set(ops) - {"topk_filtered", "top_k"} or set(merges) - set(_sharding.COLUMN_MERGES):
        parser.error(f"--ops of topk_filtered,top_k; --merges of {_sharding.COLUMN_MERGES}")
    device = jax.devices()[0]
    count = jax.local_device_count()
    print(
        f"multi-device bench: {count} x {device.device_kind} ({device.platform}), "
        f"jax {jax.__version__}"
    )
    chosen = problems(ops, args.quick, args.large)
    widest = max(layouts(count, merges), key=lambda layout: layout.column_shards)
    if widest.column_shards > 1:
        if not hlo_check_catches_scores(chosen[0], widest):
            print(f"the HLO check missed an all-gather of the scores on mesh {widest.name}")
            return 1
        print(f"HLO check control: an all-gather of the scores fails it ({widest.name})")
    records = []
    default_merge = _sharding.COLUMN_MERGE
    try:
        for problem in chosen:
            host_sets = make_sets(problem, Plan.of(problem, args.quick).sets)
            reference = jax.jit(problem.call())(*host_sets[0])
            for layout in layouts(count, merges):
                record = bench_layout(problem, layout, host_sets, reference, args.quick)
                records.append(record)
                print(
                    f"{problem.op} {problem.rows}x{problem.n} mesh {record['mesh']} "
                    f"{layout.name} ({record['column_merge'] or '-'}): "
                    f"step {_fmt(step_us(record))} us, wall {_fmt(record['wall_us'])} us, "
                    f"gather {_fmt(gather_time_us(record))} us; "
                    f"equal={record['equal_to_one_device']}; "
                    f"hlo {'passed' if record['hlo_passed'] else 'FAILED'}: {record['hlo']}",
                    flush=True,
                )
            del host_sets, reference
    finally:
        _sharding.COLUMN_MERGE = default_merge
    print(format_table(records))
    if args.json:
        report.save(records, args.json)
        command = " ".join(
            ["python -m benches.multi_device", *(argv if argv is not None else sys.argv[1:])]
        )
        print(f"wrote {args.json} and {write_markdown(records, args.json, command)}")
    failed = [r for r in records if not (r["equal_to_one_device"] and r["hlo_passed"])]
    print(
        f"{len(records) - len(failed)} of {len(records)} configurations equal to one device "
        "with the HLO check passed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
