"""A host model of merge_in_registers.cuh's sampled path (numpy, no GPU), checked against a
plain reference: for each row, the kernel's own layout (thread t holds items i = c * 4 + q at
position (c * 512 + (t + 64 c) % 512) * 4 + q: chunks rotated, kRotation), its sample (items
t % 32 and (t + 16) % 32 of thread t), the cutoff from two 11-bit digits of the sample's r-th
largest key, the filter, the order code and its 11-bit buckets (those starting at or past k are
never ranked), and the ranks within a bucket. Prints, per row family, how often the sampled path
falls back (too few or too many kept, a crowded bucket), how many entries it keeps and how many
comparisons a kept entry makes; asserts that every row it takes is exact.
Run from the repo root: python -m benches.probes.merge_sampled_model"""

from __future__ import annotations

import numpy as np

from tests.support import families
from tests.test_merge_topk import register_kernel_rows, wide_lists

THREADS, CHUNK, CHUNKS = 512, 4, 8
ROTATION = THREADS // CHUNKS
ITEMS = CHUNK * CHUNKS
DIGIT = 11
LIST_CAPACITY = 4096
MAX_BUCKET = 64
SAMPLE_SLACK = 4  # standard deviations of the sample's rank above its expected value


def ordered_keys(values, columns):
    """The kernel's 32-bit keys (0: no candidate), and the key width."""
    width = values.dtype.itemsize * 8
    bits = values.view(f"uint{width}").astype(np.uint64)
    sign = np.uint64(1 << (width - 1))
    full = np.uint64((1 << width) - 1)
    keys = np.where(bits & sign, ~bits & full, bits | sign)
    nan = np.isnan(values.astype(np.float32))
    return np.where((columns >= 0) & ~nan, keys, 0).astype(np.uint64), width


def sample_positions(width):
    t = np.arange(THREADS)
    items = np.concatenate([t % ITEMS, (t + ITEMS // 2) % ITEMS])
    threads = np.concatenate([t, t])
    chunks = items // CHUNK
    pieces = (threads + chunks * ROTATION) % THREADS
    positions = (chunks * THREADS + pieces) * CHUNK + items % CHUNK
    return positions[positions < width]


def sample_rank(k, width):
    """The sample's rank whose key is the cutoff: the top k's expected share of the sample
    (1024 of the 16384 places the kernel can hold, so 1 in 16 of any row's), plus slack.
    `width` is unused: the kernel's SampleRank(k) does not depend on it."""
    del width
    expected = k * 2 * THREADS / (THREADS * ITEMS)
    return int(np.ceil(expected + SAMPLE_SLACK * np.sqrt(expected) + 1))


def cutoff(sample, needed, key_bits):
    """SelectDigit over the sample, at most two digits: the decided prefix (the cutoff)."""
    sample = sample[sample != 0]
    prefix, mask, high = 0, 0, key_bits
    for _ in range(2):
        if high <= 0:
            break
        shift = max(high - DIGIT, 0)
        digit_mask = (1 << (high - shift)) - 1
        matching = sample[(sample & np.uint64(mask)) == prefix]
        if mask == 0 and len(matching) <= needed:
            return 0
        digits = (matching >> np.uint64(shift)) & np.uint64(digit_mask)
        counts = np.bincount(digits.astype(np.int64), minlength=digit_mask + 1)[::-1]
        above = np.cumsum(counts) - counts
        b = int(np.nonzero((above < needed) & (needed <= above + counts))[0][0])
        bin_ = digit_mask - b
        prefix |= bin_ << shift
        mask |= digit_mask << shift
        needed -= int(above[b])
        if counts[b] == needed:
            break
        high = shift
    return prefix


def sampled_row(values, columns, k):
    """The sampled path of one row: (kept, comparisons per kept entry, max bucket, why it fell
    back or None, the sorted winners (key, column) or None)."""
    keys, key_bits = ordered_keys(values, columns)
    width = len(keys)
    threshold = cutoff(keys[sample_positions(width)], sample_rank(k, width), key_bits)
    candidates = int(np.count_nonzero(keys))
    kept = np.nonzero((keys != 0) & (keys >= np.uint64(threshold)))[0]
    taken = min(k, candidates)
    if len(kept) < taken:
        return len(kept), 0, 0, "too few", None
    if len(kept) > LIST_CAPACITY:
        return len(kept), 0, 0, "too many", None
    if taken == 0:
        return 0, 0, 0, None, (np.zeros(0, np.uint64), np.zeros(0, np.int64))
    lk, lc = keys[kept].astype(np.int64), columns[kept].astype(np.int64)
    key_part, column_part = lk.max() - lk, lc - lc.min()
    column_bits = int(column_part.max()).bit_length()
    bits = int(key_part.max()).bit_length() + column_bits
    assert bits <= 63
    code = (key_part << column_bits) | column_part
    buckets = code >> max(bits - DIGIT, 0)
    sizes = np.bincount(buckets, minlength=1 << DIGIT)
    starts = np.cumsum(sizes) - sizes
    live = starts < taken  # a bucket starting at or past taken holds no winner: never ranked
    largest = int(sizes[live].max())
    comparisons = float((sizes[live].astype(np.float64) ** 2).sum() / len(kept))
    if largest > MAX_BUCKET:
        return len(kept), comparisons, largest, "crowded", None
    ranks = np.full(len(kept), LIST_CAPACITY, np.int64)
    for slot in range(len(kept)):  # the kernel's rank: its bucket's start + the smaller codes
        if not live[buckets[slot]]:
            continue
        same = np.nonzero(buckets == buckets[slot])[0]
        smaller = (code[same] < code[slot]) | ((code[same] == code[slot]) & (same < slot))
        ranks[slot] = starts[buckets[slot]] + np.count_nonzero(smaller)
    winners = np.nonzero(ranks < taken)[0]
    assert sorted(ranks[winners]) == list(range(taken))
    order = winners[np.argsort(ranks[winners])]
    return len(kept), comparisons, largest, None, (lk[order], lc[order])


def reference(values, columns, k):
    keys, _ = ordered_keys(values, columns)
    present = np.nonzero(keys)[0]
    order = np.lexsort((columns[present], -keys[present].astype(np.int64)))[:k]
    return keys[present][order].astype(np.int64), columns[present][order].astype(np.int64)


def bench_rows(rng, rows, dtype, lists_sorted):
    """The bench's merge inputs (normal values, each list's columns ascending), or each list
    sorted by value descending as top_k(sorted=True) returns it."""
    for _ in range(rows):
        values = rng.standard_normal(8 * 2048).astype(np.float32).astype(dtype)
        columns = np.sort(rng.integers(0, 16384, (8, 2048)), -1) + 16384 * np.arange(8)[:, None]
        columns = columns.reshape(-1).astype(np.int32)
        if lists_sorted:
            v = values.reshape(8, 2048)
            order = np.argsort(-v.astype(np.float32), -1, kind="stable")
            values = np.take_along_axis(v, order, -1).reshape(-1)
            columns = np.take_along_axis(columns.reshape(8, 2048), order, -1).reshape(-1)
        yield values, columns


def sorted_list_rows(rng, rows, dtype):
    """test_sorted_lists_gpu_equals_cpu's rows by kind: normal, the winners all in list 0,
    lists scaled apart."""
    values = rng.standard_normal((rows, 8, 2048)).astype(np.float32)
    values[1::3, 1:] -= 100.0
    values[2::3] *= np.exp2(np.arange(8) - 4.0)[:, None]
    values = -np.sort(-values, axis=-1).astype(dtype).reshape(rows, -1)
    columns = np.sort(rng.permutation(4 * 2048)[:2048])
    columns = (columns + 4 * 2048 * np.arange(8)[:, None]).astype(np.int32).reshape(-1)
    return [[(values[r], columns) for r in range(kind, rows, 3)] for kind in range(3)]


def report(name, rows, k):
    kept, comparisons, why = [], [], {}
    for values, columns in rows:
        n, c, _, reason, winners = sampled_row(values, columns, k)
        if winners is not None:
            want = reference(values, columns, k)
            assert np.array_equal(winners[0], want[0]) and np.array_equal(winners[1], want[1])
            kept.append(n), comparisons.append(c)
        else:
            why[reason] = why.get(reason, 0) + 1
    taken = len(kept)
    mean = lambda x: float(np.mean(x)) if x else 0.0  # noqa: E731
    print(
        f"{name:44s} k={k:5d} rows={taken + sum(why.values()):4d} fast={taken:4d} "
        f"fallback={why} kept={mean(kept):7.1f} comparisons={mean(comparisons):5.2f}"
    )


def main():
    rng = np.random.default_rng(14)
    for dtype in (families.F32, families.BF16, families.F16):
        for lists_sorted in (False, True):
            name = f"bench {dtype.name} lists sorted={lists_sorted}"
            report(name, bench_rows(rng, 200, dtype, lists_sorted), 2048)
        for lists, per_list, k in [(8, 2048, 2048), (8, 2048, 333), (3, 1999, 1500), (2, 5, 3)]:
            for family in families.FAMILIES:
                rows = [
                    wide_lists(rng, lists, per_list, dtype, family, layout)
                    for layout in ("unequal", "same_everywhere", "one_list_wins", "repeated")
                ]
                report(f"{dtype.name} {lists}x{per_list} {family}", rows, k)
        for kind, rows in enumerate(sorted_list_rows(rng, 60, dtype)):
            report(f"{dtype.name} sorted lists, kind {kind}", rows, 2048)
        values, columns = register_kernel_rows(rng, 24, 16384, dtype)
        report(f"{dtype.name} register_kernel_rows", zip(values, columns), 2048)


if __name__ == "__main__":
    main()
