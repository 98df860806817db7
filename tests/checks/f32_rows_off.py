"""Run by tests/test_f32_rows.py with JAX_TOPK_F32_ROWS=off (`python -m
tests.checks.f32_rows_off`): few float32 rows of at most 32768 columns then take the filtered
kernel (its single-block and split routes) as they did before the register kernel; every value
family, sample foolers and crowded rows must still match the CPU handler bit for bit."""

import numpy as np

from tests.support import families
from tests.support.families import sample_foolers
from tests.support.operators import run_op
from tests.test_f32_rows import crowded_rows


def main():
    rng = np.random.default_rng(60)
    cases = 0
    for n in (3, 4097, 20000, 32768):
        for k in (1, 2048):
            rows = [families.make(f, rng, (4, n), "float32") for f in sorted(families.FAMILIES)]
            rows += [sample_foolers(rng, 8, n), crowded_rows(rng, 4, n)]
            scores = np.concatenate(rows)
            lengths = rng.integers(-2, n + 3, size=len(scores)).astype(np.int32)
            lengths[:3] = [n, k, k + 1]
            for sorted_ in (False, True):
                gpu = run_op("topk_filtered", "gpu", scores, lengths, k=k, sorted=sorted_)
                cpu = run_op("topk_filtered", "cpu", scores, lengths, k=k, sorted=sorted_)
                np.testing.assert_array_equal(gpu, cpu)
                cases += 1
    print(f"filtered kernel, short float32 rows: ok ({cases} calls)")


if __name__ == "__main__":
    main()
