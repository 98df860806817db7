"""A top-k primitive bound directly, for probes that time one kernel route against another on the
same call (the public functions check dtypes and pick routes; a probe wants the kernel itself)."""

from jax_topk._contract import Operands, Params
from jax_topk._primitives import PRIMITIVES


def bind_topk(op, scores, lengths, *, k, sorted, with_values=False):
    """The primitive of `op` ("topk_bf16", "topk_filtered", "small_rows") on 2-D scores, with no
    page table and every row valid: (indices,), or (indices, values) with_values."""
    params = Params(
        op=op,
        k=k,
        log2_page_size=0,
        sorted=sorted,
        has_page_table=False,
        has_table_rows=False,
        has_num_valid_rows=False,
        with_values=with_values,
    )
    operands = Operands(
        scores=scores,
        lengths=lengths,
        page_table=Operands.absent(2),
        table_rows=Operands.absent(1),
        num_valid_rows=Operands.absent(1),
    )
    return PRIMITIVES[op].bind(*operands, params=params)
