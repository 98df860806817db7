"""Each kernel of indexer_topk (the default, unfused path: the logits to a workspace, then the
filtered selection) against indexer_logits and topk_filtered called apart on the same inputs:
which selection kernel runs (the split cluster kernel or the queue worker), and what each
kernel costs inside the op and alone (device time, median over calls, us). Written for issue
15's indexer_topk <= 1.1x indexer_logits at 128 x 65536 (benches/NOTES.md).

Run on the GPU from the repo root: python -m benches.probes.indexer_topk_kernels"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile

import jax
import numpy as np

import jax_topk
from benches import indexer
from benches.bench import Shape

SHAPES = [(128, 65536), (32, 131072), (1, 131072), (512, 65536)]
CALLS = 10


def kernel_times(fn, input_sets) -> dict[str, float]:
    """Median us a call of each kernel `fn` runs, by a short name."""
    for inputs in input_sets:
        jax.block_until_ready(fn(*inputs))
    by_name = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for i in range(CALLS):
                jax.block_until_ready(fn(*input_sets[i % len(input_sets)]))
        path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]
        for plane in jax.profiler.ProfileData.from_file(path).planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    for event in line.events:
                        by_name[short_name(event.name)].append(event.duration_ns / 1e3)
    return {name: float(np.median(times)) * len(times) / CALLS for name, times in by_name.items()}


def short_name(name: str) -> str:
    """The kernel's own name and, for the filtered kernel, split or queue."""
    if "TopkFilteredKernel" in name:
        split = re.search(r"ILb1E|Kernel<true", name)  # mangled or demangled
        return "TopkFilteredKernel<" + ("split" if split else "queue") + ">"
    match = re.search(r"(IndexerLogits\w*?Kernel|[A-Z]\w*Kernel)", name)
    return match.group(1) if match else name[:40]


def main():
    print("| M x N | call | kernel | us a call |")
    print("| --- | --- | --- | --- |")
    for m, n in SHAPES:
        shape = Shape("indexer_topk", "bfloat16", m, n, 2048, "causal", heads=64, head_dim=128)
        sets = indexer.make_inputs(shape, 4, seed=0)
        logits_fn = jax.jit(lambda q, k, w, lens, s: jax_topk.indexer_logits(q, k, w, lens))
        topk_fn = jax.jit(lambda q, k, w, lens, s: jax_topk.indexer_topk(q, k, w, lens, k=2048))
        select_fn = jax.jit(lambda logits, lens: jax_topk.topk_filtered(logits, lens, k=2048))
        logits_sets = [(logits_fn(*inputs), inputs[3]) for inputs in sets]
        for call, fn, inputs in (
            ("indexer_topk", topk_fn, sets),
            ("indexer_logits", logits_fn, sets),
            ("topk_filtered of the logits", select_fn, logits_sets),
        ):
            times = kernel_times(fn, inputs)
            for name, us in sorted(times.items(), key=lambda item: -item[1]):
                print(f"| {m}x{n} | {call} | {name} | {us:.1f} |", flush=True)
            print(f"| {m}x{n} | {call} | all | {sum(times.values()):.1f} |", flush=True)
        del sets, logits_sets


if __name__ == "__main__":
    main()
