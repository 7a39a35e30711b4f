"""Attention: `attend` and its backends (backends.py), the block-diagonal masks of native-resolution batches and
their masked kernels (masks.py), what attention reads besides q, k, v (inputs.py: PosContext, AttnRoute,
LayerPositions) and the row-block terms it takes (rows.py: RowBias, RowValue).

Nothing here imports pos/: attention declares its inputs and the PEs build them (tests/test_imports.py).
"""

from .backends import (
    BACKENDS,
    ROW_BLOCK_ELEMENTS,
    attend,
    attend_rows,
    attend_with_probs,
    attn_backend,
    check_attn_backend,
    get_attn_backend,
    set_attn_backend,
)
from .inputs import AttnRoute, LayerPositions, PosContext
from .masks import AttnMask, flex_attend, flex_available, xformers_block_attend
from .rows import RowBias, RowValue

__all__ = [
    "AttnMask",
    "AttnRoute",
    "BACKENDS",
    "LayerPositions",
    "PosContext",
    "ROW_BLOCK_ELEMENTS",
    "RowBias",
    "RowValue",
    "attend",
    "attend_rows",
    "attend_with_probs",
    "attn_backend",
    "check_attn_backend",
    "flex_attend",
    "flex_available",
    "get_attn_backend",
    "set_attn_backend",
    "xformers_block_attend",
]
