"""Shared-memory bank conflicts of merge_fine_buckets.cuh's word layout, counted on the host
(numpy, no GPU) for the bench's merge rows (5536 x 8 lists of 2048, normal values; lists in
no order or in rank order). For each warp access of the fine buckets, in the order the kernel
makes them: the count's atomics (slot order; every lane of a bank serialised), the starts read
when placing (slot order) and the start and end read when ranking (place order: consecutive
codes); a wavefront per distinct word of the busiest bank (a read of one word broadcasts).
Codes: (key, column) as the sorted output ranks them, (column, key) as the unsorted output's
second placing does. Layouts of word j of thread t's 32 buckets: `column` (j * 512 + t: all 32
in one bank; before 2026-12-05), `swizzled` (t's low five bits flipped by j and by t's parity:
as good, but its addresses cost registers), `padded` (j * 514 + t: FineBuckets::WordAt) and
`linear` (bucket b in word b / 2, for scale; its scan would conflict).
Run from the repo root: python -m benches.probes.merge_fine_banks"""

from __future__ import annotations

import numpy as np

from benches.probes.merge_fine_model import FINE_BITS, THREADS, kept_in_slot_order
from benches.probes.merge_sampled_model import bench_rows
from tests.support import families


def column_layout(b):
    return ((b >> 1) & 15) * THREADS + (b >> 5)


def swizzled_layout(b):
    t, j = b >> 5, (b >> 1) & 15
    return j * THREADS + (t ^ j ^ ((t & 1) << 4))


def padded_layout(b):
    t, j = b >> 5, (b >> 1) & 15
    return j * (THREADS + 2) + t


def linear_layout(b):
    return b >> 1


LAYOUTS = {
    "column": column_layout,
    "swizzled": swizzled_layout,
    "padded": padded_layout,
    "linear": linear_layout,
}


def read_wavefronts(words):
    banks = words % 32
    return max(len(set(words[banks == bank])) for bank in set(banks))


def atomic_wavefronts(words):
    banks = words % 32
    return max(int(np.count_nonzero(banks == bank)) for bank in set(banks))


def kept_codes(values, columns, k):
    """The sampled path's kept candidates in the kernel's slot order, as both order codes,
    and the fine buckets' shift."""
    keys, kept = kept_in_slot_order(values, columns, k)
    lk, lc = keys[kept].astype(np.uint64), columns[kept].astype(np.int64).astype(np.uint64)
    key_bits = int(lk.max() - lk.min()).bit_length()
    column_bits = int(lc.max() - lc.min()).bit_length()
    shift = np.uint64(max(key_bits + column_bits - FINE_BITS, 0))
    by_key = (lk.max() - lk) << np.uint64(column_bits) | (lc - lc.min())
    by_column = (lc - lc.min()) << np.uint64(key_bits) | (lk.max() - lk)
    return {"key": by_key, "column": by_column}, shift


def wavefronts(buckets, layout):
    """(count, place, rank) wavefronts of one use of the fine buckets."""
    places = np.sort(buckets)
    ends = np.minimum(places + 1, (1 << FINE_BITS) - 1)
    count = place = rank = 0
    for first in range(0, len(buckets), 32):
        warp = slice(first, first + 32)
        count += atomic_wavefronts(layout(buckets[warp]))
        place += read_wavefronts(layout(buckets[warp]))
        rank += read_wavefronts(layout(places[warp])) + read_wavefronts(layout(ends[warp]))
    return count, place, rank


def main():
    rng = np.random.default_rng(3)
    print("| lists | code | layout | count | place | rank | ideal each |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for dtype in (families.F32, families.BF16):
        for ranked in (False, True):
            totals = {}
            for values, columns in bench_rows(rng, 8, dtype, ranked):
                codes, shift = kept_codes(values, columns, 2048)
                for code_name, code in codes.items():
                    buckets = (code >> shift).astype(np.int64)
                    for name, layout in LAYOUTS.items():
                        got = (*wavefronts(buckets, layout), len(buckets) / 32)
                        totals.setdefault((code_name, name), []).append(got)
            for (code_name, name), rows in totals.items():
                count, place, rank, ideal = np.mean(rows, axis=0)
                lists = f"{dtype.name} {'rank order' if ranked else 'no order'}"
                print(
                    f"| {lists} | {code_name} | {name} | {count:.0f} | {place:.0f} | {rank:.0f} "
                    f"| {ideal:.0f} |"
                )


if __name__ == "__main__":
    main()
