"""Loading published CvT weights: the official checkpoints (leoxiaobin/CvT) and the Hugging Face transformers port.

Official names: `stage{s}.patch_embed.{proj,norm}`, `stage2.cls_token`, `stage{s}.blocks.{j}.{norm1,norm2}`,
`...attn.conv_proj_{q,k,v}.{conv,bn}`, `...attn.proj_{q,k,v}`, `...attn.proj`, `...mlp.{fc1,fc2}`, `norm`, `head`.
Ours are the same with `stages.{s}` in place of `stage{s}`.
Transformers (`CvtForImageClassification`): `cvt.encoder.stages.{s}.embedding.convolution_embeddings.{projection,
normalization}`, `cvt.encoder.stages.{s}.layers.{j}.attention.attention.convolution_projection_{query,key,value}
.convolution_projection.{convolution,normalization}`, `...attention.attention.projection_{query,key,value}`,
`...attention.output.dense`, `...intermediate.dense`, `...output.dense`, `...layernorm_{before,after}`, `layernorm`,
`classifier`. The port uses GELU where the official models use QuickGELU: build with `act_layer="gelu"` to
reproduce its outputs.
"""

from __future__ import annotations

import re

from ..pos.base import CheckpointMismatch
from .checkpoint_filters import describe_checkpoint, ensure_fits, unwrap

__all__ = ["checkpoint_filter_fn"]

_QKV = {"query": "q", "key": "k", "value": "v"}

# (pattern, replacement) applied in order to the part of a transformers key after `stages.{s}.`
_HF_RULES = [
    (r"^embedding\.convolution_embeddings\.projection\.", "patch_embed.proj."),
    (r"^embedding\.convolution_embeddings\.normalization\.", "patch_embed.norm."),
    (
        r"^layers\.(\d+)\.attention\.attention\.convolution_projection_(query|key|value)\.convolution_projection"
        r"\.convolution\.",
        lambda m: f"blocks.{m[1]}.attn.conv_proj_{_QKV[m[2]]}.conv.",
    ),
    (
        r"^layers\.(\d+)\.attention\.attention\.convolution_projection_(query|key|value)\.convolution_projection"
        r"\.normalization\.",
        lambda m: f"blocks.{m[1]}.attn.conv_proj_{_QKV[m[2]]}.bn.",
    ),
    (
        r"^layers\.(\d+)\.attention\.attention\.projection_(query|key|value)\.",
        lambda m: f"blocks.{m[1]}.attn.proj_{_QKV[m[2]]}.",
    ),
    (r"^layers\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (r"^layers\.(\d+)\.intermediate\.dense\.", r"blocks.\1.mlp.fc1."),
    (r"^layers\.(\d+)\.output\.dense\.", r"blocks.\1.mlp.fc2."),
    (r"^layers\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^layers\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"^cls_token$", "cls_token"),
]


def _from_hf(key: str) -> str | None:
    if key.startswith("layernorm."):
        return "norm." + key[len("layernorm.") :]
    if key.startswith("classifier."):
        return "head." + key[len("classifier.") :]
    m = re.match(r"^(?:cvt\.)?encoder\.stages\.(\d+)\.(.*)$", key)
    if m is None:
        return None
    stage, rest = m[1], m[2]
    for pattern, repl in _HF_RULES:
        new, n = re.subn(pattern, repl, rest)
        if n:
            return f"stages.{stage}.{new}"
    return None


def checkpoint_filter_fn(state_dict: dict, model) -> dict:
    """Rename an official CvT or transformers `CvtForImageClassification` state dict for a visionpe CvT."""
    original = state_dict = unwrap(state_dict)
    if any(k.startswith("stages.") for k in state_dict):  # already ours
        return state_dict
    hf = any(k.startswith(("cvt.", "encoder.")) for k in state_dict)
    if not hf and not any(k.startswith("stage") for k in state_dict):
        raise CheckpointMismatch(f"this is not a CvT checkpoint but {describe_checkpoint(state_dict)}")
    out = {}
    for k, v in state_dict.items():
        if hf:
            new = _from_hf(k)
            if new is None:
                raise CheckpointMismatch(f"unexpected key {k!r} in a transformers CvT checkpoint")
        else:
            new = re.sub(r"^stage(\d+)\.", r"stages.\1.", k)
        out[new] = v
    # the published models have no PE: a model with PE parameters loads the rest (strict=False) and trains the PE
    missing = sorted(
        k
        for k in set(model.state_dict().keys()) - out.keys()
        if not k.startswith(("pe.", "head.")) and "num_batches" not in k
    )
    if missing:
        raise CheckpointMismatch(
            f"the checkpoint lacks {missing[:3]}...; it is not a CvT of this size (depths, widths or cls_token "
            f"differ): it is {describe_checkpoint(original)}"
        )
    ensure_fits(out, model, original, skip=("head.", "pe."))
    return out
