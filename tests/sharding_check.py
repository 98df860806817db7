"""Run in its own process by test_sharding.py, with 8 host devices: row-sharded calls equal
the unsharded ones and the compiled HLO has no all-gather of the scores."""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from conftest import OPS, SCORE_DTYPES, permuted_page_table  # noqa: E402
from jax_topk import _families  # noqa: E402


def main():
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(30)
    rows, n, k, page_size = 32, 1000, 16, 8
    checks = 0
    for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
        for op in OPS:
            scores = _families.make("heavy_ties", rng, (rows, n), SCORE_DTYPES[op])
            lengths = rng.integers(-5, n + 5, size=rows).astype(np.int32)
            table = permuted_page_table(rng, rows, n // page_size + 1)
            for row_axes in ("data", ("data", "model")):
                def put(x, spec):
                    return jax.device_put(x, NamedSharding(mesh, spec))
                args = (put(scores, P(row_axes, None)), put(lengths, P(row_axes)),
                        put(table, P(row_axes, None)))
                fn = jax.jit(lambda s, l, t, v, op=op: OPS[op](
                    s, l, k=k, page_table=t, page_size=page_size, num_valid_rows=v))
                for valid in (0, 5, 13, 31, 32, 40, -1):
                    sharded = fn(*args, np.int32(valid))
                    unsharded = fn(scores, lengths, table, np.int32(valid))
                    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(unsharded))
                    assert sharded.sharding.spec[0] is not None, sharded.sharding
                    checks += 1
                hlo = fn.lower(*args, np.int32(7)).compile().as_text()
                assert "all-gather" not in hlo, "the partitioned call gathered its operands"
    print(f"sharding: {checks} sharded calls equal the unsharded ones, no all-gather")


if __name__ == "__main__":
    main()
