"""merge_topk's part of the bench (SPEC section 8): its inputs, the calls timed (ours and
what a JAX user writes today), the floor and the check.

A shape `merge_topk <dtype> <rows>x<n> k=<k>` is n / k candidate lists of k a row, as that
many column shards' top_k results arrive: random normal values, each list's global columns
distinct and ascending inside its own shard's range (`sorted`: each list in rank order, as
top_k(sorted=True) returns it; `full`: in no order). The peers merge the way a JAX user
would without us: `jax.lax.top_k` over the concatenated values, then the columns gathered
at its positions; `torch.topk` the same. The floor reads every candidate's value and column once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benches import scores as scores_of
from jax_topk import merge_topk

OP = "merge_topk"
SHARD_COLUMNS = 16384  # each list's columns lie in [s * SHARD_COLUMNS, (s + 1) * SHARD_COLUMNS)


def lists(shape) -> int:
    return shape.n // shape.k


def input_bytes(shape) -> int:
    """Bytes of one input set (and what the floor reads): a value and an int32 column each."""
    return shape.rows * shape.n * (jnp.dtype(shape.dtype).itemsize + 4)


def make_inputs(shape, sets: int, seed: int) -> list[tuple]:
    """`sets` pairs (values [rows, n], columns [rows, n] int32); with `lengths` "sorted" each
    list's values descending (as top_k(sorted=True) returns a list), else in no order."""
    base = jax.random.key(seed)
    shard_offsets = SHARD_COLUMNS * jnp.arange(lists(shape))[None, :, None]
    out = []
    for i in range(sets):
        values_key, columns_key = jax.random.split(jax.random.fold_in(base, i))
        values = scores_of.normal(values_key, (shape.rows, shape.n), shape.dtype)
        # Distinct ascending columns: the j-th of a list in [j, j + 1) * SHARD_COLUMNS / k.
        stride = SHARD_COLUMNS // shape.k
        jitter = jax.random.randint(columns_key, (shape.rows, lists(shape), shape.k), 0, stride)
        columns = stride * jnp.arange(shape.k) + jitter + shard_offsets
        if shape.lengths == "sorted":  # distinct columns: (value, column) order is value order
            per_list = values.reshape(shape.rows, lists(shape), shape.k)
            order = jnp.argsort(-per_list.astype(jnp.float32), axis=-1, stable=True)
            values = jnp.take_along_axis(per_list, order, axis=-1).reshape(values.shape)
            columns = jnp.take_along_axis(columns, order, axis=-1)
        out.append((values, columns.reshape(shape.rows, shape.n).astype(jnp.int32)))
    return out


def ours_call(k: int):
    return lambda values, columns: merge_topk(values, columns, k)


def lax_call(k: int):
    """The merge without jax_topk: a full top-k over the candidates, columns gathered."""

    def lax_merge(values, columns):
        top_values, positions = jax.lax.top_k(values, k)
        return top_values, jnp.take_along_axis(columns, positions, axis=1)

    return lax_merge


def torch_merge_us(input_sets, k: int, repeats: int):
    """(median us by CUDA events, the first set's selected values descending as float32) of
    torch.topk over the candidates plus the gather of their columns; None without torch's
    GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tensors = [(torch.from_dlpack(v), torch.from_dlpack(c)) for v, c in input_sets]

    def merge(values, columns):
        top = torch.topk(values, k, dim=-1)
        return top.values, torch.gather(columns, 1, top.indices)

    for values, columns in tensors:
        merge(values, columns)
    first = merge(*tensors[0])[0].float().cpu().numpy()
    samples = []
    for i in range(repeats):
        values, columns = tensors[i % len(tensors)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        merge(values, columns)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return float(np.median(samples)), first


def same_values(ours_values, peer_values) -> bool:
    """The k largest values are one multiset whatever the tie order: the same bits, in rank
    order, as the peer's."""
    a = np.asarray(jnp.asarray(ours_values, jnp.float32))
    b = np.asarray(jnp.asarray(peer_values, jnp.float32))
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
