"""A host model of merge_in_registers.cuh's fine-bucket rank (RankByFineBuckets, numpy, no
GPU) on top of the sampled cutoff of merge_sampled_model.py: the kept list in the kernel's
slot order, 16384 buckets of the top bits of the (key, column) code, arrivals within a
bucket in a random order (the atomics' order is not fixed), ranks by the bucket's smaller
codes; sorted, ranks < k are the places; unsorted, only the bucket holding rank k is ranked,
then the winners by (column, key) buckets. Asserts both orders equal a plain reference on
every row it takes; prints per row kind how often a crowded bucket sends a row back to the
register steps, the share of ranked places alone in their bucket and the comparisons the
slowest warp makes. Run from the repo root: python -m benches.probes.merge_fine_model"""

from __future__ import annotations

import numpy as np

from benches.probes.merge_sampled_model import (
    LIST_CAPACITY,
    MAX_BUCKET,
    ROTATION,
    bench_rows,
    cutoff,
    ordered_keys,
    reference,
    sample_positions,
    sample_rank,
)
from tests.support import families
from tests.test_merge_topk import fine_bucket_rows, register_kernel_rows, wide_lists

THREADS, FINE_BITS = 512, 14


def place_and_rank(rng, code, shift, limit, only_straddling):
    """Codes grouped by bucket (arrival order random), each ranked place's rank (-1: not
    ranked), and why it fell back (None) plus the slowest warp's comparisons."""
    buckets = code >> np.uint64(shift)
    sizes = np.bincount(buckets.astype(np.int64), minlength=1 << FINE_BITS)
    starts = np.cumsum(sizes) - sizes
    ranked = starts < limit
    if only_straddling:
        ranked &= starts + sizes > limit
    if ranked.any() and sizes[ranked].max() > MAX_BUCKET:
        return None, None, None
    placed = code[np.lexsort((rng.random(len(code)), buckets))]
    place_bucket = (placed >> np.uint64(shift)).astype(np.int64)
    ranks = np.full(len(placed), -1, np.int64)
    cost = np.zeros(len(placed), np.int64)
    for p in range(len(placed)):
        b = place_bucket[p]
        first, end = starts[b], starts[b] + sizes[b]
        if not ranked[b] if only_straddling else first >= limit:
            continue
        others = placed[first:end]
        j = np.arange(first, end)
        ranks[p] = first + np.count_nonzero(
            (others < placed[p]) | ((others == placed[p]) & (j < p))
        )
        cost[p] = end - first if end - first > 1 else 0
    warps = np.concatenate([cost, np.zeros(-len(cost) % THREADS, np.int64)])
    slowest = warps.reshape(-1, THREADS // 32, 32).max(axis=2).sum(axis=0).max()
    single = np.mean(sizes[place_bucket][ranks >= 0] == 1) if (ranks >= 0).any() else 1.0
    return placed, ranks, (single, slowest)


def kept_in_slot_order(values, columns, k):
    """The row's ordered keys and the sampled path's kept positions in the kernel's slot
    order (each thread's kept items in a run, threads ascending)."""
    keys, key_bits = ordered_keys(values, columns)
    width = len(keys)
    threshold = cutoff(keys[sample_positions(width)], sample_rank(k, width), key_bits)
    positions = np.arange(width)
    chunks = positions // (4 * THREADS)
    threads = ((positions // 4) % THREADS - ROTATION * chunks) % THREADS  # kRotation
    thread_major = np.lexsort((positions % 4, chunks, threads))
    kept = thread_major[(keys[thread_major] != 0) & (keys[thread_major] >= np.uint64(threshold))]
    return keys, kept


def fine_row(rng, values, columns, k, sorted_):
    """The kernel's sampled path with the fine rank for one row: (why it fell back or None,
    stats, winners (keys, columns) in output order)."""
    keys, kept = kept_in_slot_order(values, columns, k)
    taken = min(k, int(np.count_nonzero(keys)))
    if len(kept) < taken or len(kept) > LIST_CAPACITY:
        return "kept", None, None
    if taken == 0:
        return None, None, (np.zeros(0, np.int64), np.zeros(0, np.int64))
    lk, lc = keys[kept].astype(np.uint64), columns[kept].astype(np.int64).astype(np.uint64)
    key_bits = int(lk.max() - lk.min()).bit_length()
    column_bits = int(lc.max() - lc.min()).bit_length()
    shift = max(key_bits + column_bits - FINE_BITS, 0)
    code = (lk.max() - lk) << np.uint64(column_bits) | (lc - lc.min())
    placed, ranks, stats = place_and_rank(rng, code, shift, taken, not sorted_)
    if placed is None:
        return "crowded by key", None, None
    decode_key = lambda c: (lk.max() - (c >> np.uint64(column_bits))).astype(np.int64)  # noqa: E731
    column_mask = np.uint64((1 << column_bits) - 1)
    if sorted_:
        winners = np.nonzero((ranks >= 0) & (ranks < taken))[0]
        assert sorted(ranks[winners]) == list(range(taken))
        out = placed[winners[np.argsort(ranks[winners])]]
        return None, stats, (decode_key(out), (lc.min() + (out & column_mask)).astype(np.int64))
    moved = placed.copy()
    straddling = np.nonzero((ranks >= 0) & (ranks < taken))[0]
    moved[ranks[straddling]] = placed[straddling]
    column_code = (moved[:taken] & column_mask) << np.uint64(key_bits) | (
        moved[:taken] >> np.uint64(column_bits)
    )
    placed2, ranks2, stats2 = place_and_rank(rng, column_code, shift, taken, False)
    if placed2 is None:
        return "crowded by column", None, None
    assert sorted(ranks2) == list(range(taken))
    out = placed2[np.argsort(ranks2)]
    key_mask = np.uint64((1 << key_bits) - 1)
    out_keys = (lk.max() - (out & key_mask)).astype(np.int64)
    out_columns = (lc.min() + (out >> np.uint64(key_bits))).astype(np.int64)
    return None, (stats[0], stats[1] + stats2[1]), (out_keys, out_columns)


def report(rng, name, rows, k):
    for sorted_ in (True, False):
        why, single, slowest, fast = {}, [], [], 0
        for values, columns in rows:
            reason, stats, got = fine_row(rng, values, columns, k, sorted_)
            if got is None:
                why[reason] = why.get(reason, 0) + 1
                continue
            want_keys, want_columns = reference(values, columns, k)
            if not sorted_:
                order = np.lexsort((-want_keys, want_columns))
                want_keys, want_columns = want_keys[order], want_columns[order]
            assert np.array_equal(got[0], want_keys) and np.array_equal(got[1], want_columns), name
            fast += 1
            if stats is not None:
                single.append(stats[0]), slowest.append(stats[1])
        mean = lambda x: float(np.mean(x)) if x else 0.0  # noqa: E731
        print(
            f"{name:40s} k={k:5d} sorted={sorted_:d} fast={fast:4d} fallback={why} "
            f"alone={mean(single):.2f} slowest warp={mean(slowest):5.1f}"
        )


def main():
    rng = np.random.default_rng(14)
    for dtype in (families.F32, families.BF16, families.F16):
        report(rng, f"bench {dtype.name}", list(bench_rows(rng, 40, dtype, False)), 2048)
        for k in (2048, 1500):
            values, columns = fine_bucket_rows(rng, 36, dtype, k)
            for kind in range(6):
                rows = list(zip(values[kind::6], columns[kind::6]))
                report(rng, f"{dtype.name} fine_bucket_rows kind {kind}", rows, k)
        for family in families.FAMILIES:
            rows = [
                wide_lists(rng, 8, 2048, dtype, family, layout)
                for layout in ("unequal", "same_everywhere", "one_list_wins", "repeated")
            ]
            report(rng, f"{dtype.name} 8x2048 {family}", rows, 2048)
        values, columns = register_kernel_rows(rng, 12, 16384, dtype)
        report(rng, f"{dtype.name} register_kernel_rows", list(zip(values, columns)), 2048)


if __name__ == "__main__":
    main()
