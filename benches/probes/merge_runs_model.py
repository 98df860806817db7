"""A host model (numpy, no GPU) of a merge_topk path for rows that arrive as a few sorted
runs: the candidate lists of top_k(sorted=True) calls (a running top-k over key chunks,
split-KV decode), each in rank order with its -1 slots last. Not in the kernel yet: this
model checks the algorithm that benches/probes/merge_runs.cu times, before it goes there.

1. Each candidate's 64-bit rank key R = ordered key << 32 | ~column (0: no candidate); a
   larger R ranks first. A run is a maximal stretch of non-increasing R; a row of more than
   MAX_RUNS runs (any unsorted row) goes to the existing path.
2. Runs longer than k are cut to k. A tree of pairwise merges, each output cut to k: a level
   merges runs 2i and 2i + 1 (an odd last run passes on), so log2(runs) levels. Within a
   level, the outputs of all pairs are one range split evenly over THREADS threads; a
   thread finds where its first output comes from by a binary search on the pair (the
   co-rank: how many of its first p outputs come from the left run), then merges its share
   one output at a time. Ties of equal R (the same value and column twice) go left first;
   they write the same bits either way.
3. The last level's first min(k, candidates) entries are the sorted output.
Exact by construction: the top k of a union is the top k of the union of each part's top k.

Asserts the output equals a plain reference on every row that takes the path (bench rows
with sorted lists, every family x every layout of tests/test_merge_topk.py's wide lists,
sorted) and prints, per kind, how many rows took it, the runs and the largest co-rank
search and merge share a thread makes (the kernel's per-level work).
Run from the repo root: python -m benches.probes.merge_runs_model"""

from __future__ import annotations

import numpy as np

from benches.probes.merge_sampled_model import bench_rows, ordered_keys, reference
from tests.support import families
from tests.test_merge_topk import wide_lists

THREADS = 512
MAX_RUNS = 16


def rank_keys(values, columns):
    keys, _ = ordered_keys(values, columns)
    inverted = (~columns.astype(np.int64)) & 0xFFFFFFFF
    return np.where(keys > 0, (keys << np.uint64(32)) | inverted.astype(np.uint64), 0).astype(
        np.uint64
    )


def runs_of(rank):
    """(start, length) of each maximal non-increasing stretch of `rank`."""
    starts = np.concatenate([[0], np.nonzero(rank[1:] > rank[:-1])[0] + 1])
    ends = np.concatenate([starts[1:], [len(rank)]])
    return list(zip(starts.tolist(), (ends - starts).tolist()))


def co_rank(rank, left, right, p):
    """How many of the first p outputs of merging `left` then `right` (position arrays into
    `rank`, each non-increasing) come from `left`; ties go left. Returns it and the search's
    steps. The largest i in [lo, hi] with i == lo or left[i - 1] >= right[p - i]."""
    lo, hi = max(0, p - len(right)), min(p, len(left))
    steps = 0
    while lo < hi:
        # The candidate i = mid > lo >= p - len(right): right[p - mid] always exists.
        mid = (lo + hi + 1) // 2
        steps += 1
        if rank[left[mid - 1]] >= rank[right[p - mid]]:
            lo = mid
        else:
            hi = mid - 1
    return lo, steps


def merge_level(rank, sequences, k):
    """One level: pairs merged and cut to k, the work split over THREADS threads as the
    kernel splits it. Returns the next level's sequences and the largest search steps and
    share of one thread."""
    pairs = [(sequences[i], sequences[i + 1] if i + 1 < len(sequences) else sequences[i][:0])
             for i in range(0, len(sequences), 2)]  # fmt: skip
    sizes = [min(k, len(a) + len(b)) for a, b in pairs]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    total = int(starts[-1])
    share = -(-total // THREADS)
    outputs = [np.empty(size, np.int64) for size in sizes]
    most_steps = 0
    for thread in range(THREADS):
        first, end = thread * share, min(total, (thread + 1) * share)
        steps = 0
        while first < end:  # a thread's share may span the end of one pair and the next
            pair = int(np.searchsorted(starts, first, side="right")) - 1
            left, right = pairs[pair]
            p, stop = first - starts[pair], min(end, starts[pair + 1]) - starts[pair]
            i, search = co_rank(rank, left, right, p)
            steps += search
            j = p - i
            for out in range(p, stop):
                take_left = j >= len(right) or (i < len(left) and rank[left[i]] >= rank[right[j]])
                outputs[pair][out] = left[i] if take_left else right[j]
                i, j = (i + 1, j) if take_left else (i, j + 1)
            first = starts[pair] + stop
        most_steps = max(most_steps, steps)
    return outputs, most_steps, share


def merged_by_runs(values, columns, k):
    """The sorted output's (keys, columns) by the run merge, or None (too many runs), and
    the work: runs, levels' largest search steps and shares."""
    rank = rank_keys(values, columns)
    runs = runs_of(rank)
    if len(runs) > MAX_RUNS:
        return None, len(runs), []
    sequences = [np.arange(start, start + min(length, k)) for start, length in runs]
    work = []
    while len(sequences) > 1:
        sequences, steps, share = merge_level(rank, sequences, k)
        work.append((steps, share))
    winners = sequences[0]
    winners = winners[rank[winners] > 0]  # no-candidate entries rank last: cut them off
    keys = (rank[winners] >> np.uint64(32)).astype(np.int64)
    return (keys, columns[winners].astype(np.int64)), len(runs), work


def as_sorted_lists(values, columns, lists):
    """The row's `lists` equal parts, each in rank order as top_k(sorted=True) returns it
    (-1 slots and NaN last; equal ranks kept in place order)."""
    rank = rank_keys(values, columns).reshape(lists, -1)
    places = np.arange(rank.shape[1])
    order = np.stack([np.lexsort((places, ~r)) for r in rank])
    return tuple(np.take_along_axis(a.reshape(lists, -1), order, -1).reshape(-1)
                 for a in (values, columns))  # fmt: skip


def report(name, rows, k):
    taken, fallback, runs, work = 0, 0, [], []
    for values, columns in rows:
        got, run_count, levels = merged_by_runs(values, columns, k)
        runs.append(run_count)
        if got is None:
            fallback += 1
            continue
        want = reference(values, columns, k)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), name
        taken += 1
        work.append(levels)
    deepest = max(work, key=len, default=[])
    print(
        f"{name:44s} k={k:5d} rows={taken + fallback:4d} runs path={taken:4d} "
        f"fallback={fallback:4d} runs={min(runs)}-{max(runs)} "
        f"levels (search steps, share)={deepest}"
    )


def main():
    rng = np.random.default_rng(15)
    for dtype in (families.F32, families.BF16, families.F16):
        for lists_sorted in (False, True):
            name = f"bench {dtype.name} lists sorted={lists_sorted}"
            report(name, bench_rows(rng, 20, dtype, lists_sorted), 2048)
        for lists, per_list, k in [(8, 2048, 2048), (8, 2048, 333), (3, 1999, 1500), (2, 5, 3),
                                   (16, 1024, 2048), (2, 2048, 2048)]:  # fmt: skip
            for family in families.FAMILIES:
                rows = [
                    as_sorted_lists(*wide_lists(rng, lists, per_list, dtype, family, layout), lists)
                    for layout in ("unequal", "same_everywhere", "one_list_wins", "repeated")
                ]
                report(f"{dtype.name} sorted {lists}x{per_list} {family}", rows, k)


if __name__ == "__main__":
    main()
