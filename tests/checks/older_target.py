"""For a build whose CUDA code targets only pre-Hopper architectures, run on a Hopper GPU
(`bash tests/checks/older_target.sh` builds it for compute_80 PTX, which the driver then
JIT-compiles, and runs this): the kernels that need sm_90 (thread block clusters, bulk copies,
wgmma) are compiled empty or without those instructions there, so the host must route around
them even though the device's compute capability is 9 or later. Checks that the cluster kernel
declines a call forced onto it (JAX_TOPK_F32_CLUSTER=only fails), and that the shapes which
take the cluster
kernels, the filtered kernel's split rows, merge_topk's staged rows and the wgmma indexer on a
Hopper build still match the CPU handler bit for bit here."""

import jax
import numpy as np

import jax_topk
from tests.support import families
from tests.support.bits import assert_same_bits
from tests.support.families import sample_foolers
from tests.support.indexer import logits_then_topk, make_inputs
from tests.support.operators import kernel_switches, run_on, run_op


def _same(fn, *arrays):
    gpu, cpu = run_on("gpu", fn, *arrays), run_on("cpu", fn, *arrays)
    for g, c in zip(jax.tree.leaves(gpu), jax.tree.leaves(cpu), strict=True):
        assert_same_bits(g, c)


def _family_rows(rng, rows_each, n, dtype):
    rows = [families.make(f, rng, (rows_each, n), dtype) for f in sorted(families.FAMILIES)]
    foolers = sample_foolers(rng, 2, n)
    return np.concatenate(rows + [foolers.astype(np.dtype(dtype))])


def on_hopper_or_later():
    """Only there would the host have launched the cluster kernels: elsewhere this check
    proves nothing about their gate."""
    device = jax.devices("gpu")[0]
    capability = float(getattr(device, "compute_capability", "0"))
    if capability < 9.0:
        raise SystemExit(f"needs a GPU of compute capability 9.0 or later, not {capability}")


def cluster_kernel_declines():
    """The cluster kernel's code here is empty: a call forced onto it must fail, not return
    unwritten outputs."""
    try:
        with kernel_switches(JAX_TOPK_F32_CLUSTER="only"):
            scores = np.zeros((1, 32768), np.float32)
            run_op("topk_filtered", "gpu", scores, np.array([32768], np.int32), k=2048)
    except Exception as error:  # the FFI call's error reaches JAX as a runtime error
        if "launch failed" not in str(error):
            raise
        print(f"cluster kernel declined: {type(error).__name__}")
    else:
        raise AssertionError("the cluster kernel took a call in a build without its code")


def selection_shapes(rng):
    """Shapes the cluster kernel and the filtered split take on a Hopper build, dispatched as
    usual (and with the cluster kernel off, so that few long rows reach the split)."""
    calls = 0
    for switches in ({}, {"JAX_TOPK_F32_CLUSTER": "off"}):
        with kernel_switches(**switches):
            for dtype, n in (("float32", 32768), ("float32", 131072), ("bfloat16", 131072)):
                scores = _family_rows(rng, 1, n, dtype)
                lengths = rng.integers(-2, n + 3, size=len(scores)).astype(np.int32)
                lengths[:3] = [n, 2048, 2049]
                for rows in (1, 4, len(scores)):  # one row, few rows, every family and foolers
                    for sorted_ in (False, True):
                        _same(
                            lambda s, lens: jax_topk.top_k(s, 2048, lengths=lens, sorted=sorted_),
                            scores[:rows],
                            lengths[:rows],
                        )
                        calls += 1
    print(f"cluster and split shapes: ok ({calls} calls)")


def merge_rows(rng):
    """merge_topk's wide rows (staged through shared memory on a Hopper build) and narrow ones."""
    calls = 0
    for lists in (2, 8):
        values = _family_rows(rng, 1, lists * 2048, "float32")[:16]
        indices = np.stack([rng.permutation(1 << 20)[: lists * 2048] for _ in values])
        indices = indices.astype(np.int32)
        indices[:, ::9] = -1
        _same(lambda v, i: jax_topk.merge_topk(v, i, 2048), values, indices)
        calls += 1
    print(f"merge_topk rows: ok ({calls} calls)")


def indexer_rows(rng):
    """The indexer, whose wgmma kernel is empty here (the portable kernel serves it)."""
    q, keys, weights = make_inputs(rng, 4, 64, 128, 5000)
    lengths = np.array([5000, 2048, 1, 4000], np.int32)
    _same(lambda *a: logits_then_topk(*a, k=512), q, keys, weights, lengths)
    _same(lambda *a: jax_topk.indexer_topk(*a, k=512), q, keys, weights, lengths)
    print("indexer_topk: ok (2 calls)")


def main():
    rng = np.random.default_rng(61)
    on_hopper_or_later()
    cluster_kernel_declines()
    selection_shapes(rng)
    merge_rows(rng)
    indexer_rows(rng)


if __name__ == "__main__":
    main()
