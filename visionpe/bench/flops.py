"""FLOPs of a model at one input size: fvcore's counter with a handler for scaled_dot_product_attention.

fvcore counts one fused multiply-add as one FLOP (so "GFLOPs" here are GMACs, the convention timm and the papers
use) and ignores element-wise ops (softmax, rotations, additions). Without a handler, the fused attention kernel is
an unsupported op and the two attention matmuls (about 2 N^2 C per layer) would silently go uncounted.
`vit_flops_by_hand` restates the count for a plain ViT so that the tests can check the counter against it.
"""

from __future__ import annotations

import logging
from math import prod

import torch
from torch import nn

__all__ = ["sdpa_flop_jit", "count_flops", "vit_flops_by_hand"]


def _shape(value) -> list[int]:
    from fvcore.nn.jit_handles import get_shape

    shape = get_shape(value)
    if shape is None:
        raise ValueError("scaled_dot_product_attention traced without complete shapes; trace with real tensors")
    return list(shape)


def sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """aten::scaled_dot_product_attention(q [.., N, d], k [.., M, d], v [.., M, dv]): q k^T is N*M*d MACs per
    batch x head, probs @ v is N*M*dv; the softmax and the mask are element-wise and not counted."""
    q, k, v = (_shape(x) for x in inputs[:3])
    batch_heads = prod(q[:-2])
    n, d, m, dv = q[-2], q[-1], k[-2], v[-1]
    return batch_heads * n * m * (d + dv)


def count_flops(model: nn.Module, inputs, by_operator: bool = False):
    """Total MACs of one forward pass (model in eval mode; `inputs` a tensor or a tuple of positional tensors).
    With `by_operator`, also the Counter per aten op (e.g. {'linear': ..., 'scaled_dot_product_attention': ...})."""
    try:
        from fvcore.nn import FlopCountAnalysis
    except ImportError:
        raise ImportError('counting FLOPs needs fvcore: pip install "visionpe[bench]"') from None

    was_training = model.training
    model.eval()
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    logging.getLogger("fvcore").setLevel(logging.ERROR)  # traces of our layout caches are harmless
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(model, args)
            analysis.set_op_handle("aten::scaled_dot_product_attention", sdpa_flop_jit)
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
            total = analysis.total()
            ops = analysis.by_operator() if by_operator else None
    finally:
        model.train(was_training)
    return (total, ops) if by_operator else total


def vit_flops_by_hand(
    img: int,
    patch: int,
    dim: int,
    depth: int,
    num_classes: int,
    in_chans: int = 3,
    num_prefix: int = 1,
    mlp_ratio: float = 4.0,
) -> dict[str, int]:
    """MACs of a ViT with CLS pooling, by part, counted as fvcore does (LayerNorm: 5 per element)."""
    n = (img // patch) ** 2
    t = n + num_prefix
    hidden = int(dim * mlp_ratio)
    per_block = {
        "linear": t * dim * 3 * dim + t * dim * dim + 2 * t * dim * hidden,  # qkv, proj, fc1, fc2
        "attention": 2 * t * t * dim,  # q k^T and probs @ v over all heads
        "layer_norm": 2 * 5 * t * dim,
    }
    return {
        "conv": n * dim * in_chans * patch * patch,
        "linear": depth * per_block["linear"] + dim * num_classes,  # blocks + head on the CLS token
        "attention": depth * per_block["attention"],
        "layer_norm": depth * per_block["layer_norm"] + 5 * t * dim,  # blocks + final norm
    }
