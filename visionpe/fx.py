"""FX tracing (torch.fx.symbolic_trace, timm's features_only=True with feature_cls="fx", torchvision's
create_feature_extractor).

An FX graph holds no Python control flow on sizes, and every visionpe model builds its token layout (and from it
the PEs' tables, buckets and rotations) from the input's size. The ViT family therefore traces at its reference
input size (`img_size`, changed with `set_input_size`): while tracing, the layout of that grid is built once and
becomes a constant of the graph, and the helpers that read tensors as data are graph leaves (registered with
`torch.fx.wrap` and timm's `register_notrace_function`). The graph then serves exactly that input size.

The other families (Swin's windows and masks, CvT's per-stage grids, video clips, multimodal sequences) and iRPE
(bucket lookups chosen per size) cannot be traced that way; they raise `fx_unsupported`'s error, which names what
works instead: `torch.export.export` (which keeps sizes symbolic) or `forward_intermediates` / the default
`features_only=True` (feature_cls="getter").
"""

from __future__ import annotations

import torch
import torch.fx._symbolic_trace as _fx_trace

__all__ = ["fx_unsupported", "is_fx_tracing"]


def is_fx_tracing() -> bool:
    """Whether torch.fx's symbolic tracer is running (not torch.compile / torch.export, which keep sizes)."""
    symbolic = getattr(_fx_trace, "is_fx_symbolic_tracing", None)
    if symbolic is not None:
        return symbolic()
    return bool(getattr(_fx_trace, "_is_fx_tracing_flag", False)) and not torch.compiler.is_compiling()


def fx_unsupported(what: str) -> None:
    """Raise the one-line error for a model part FX cannot trace (call it only while tracing)."""
    raise RuntimeError(
        f"{what} cannot be traced with torch.fx (its layout depends on the input size); use "
        "torch.export.export(model, (x,)) for a graph, or forward_intermediates / features_only=True "
        "(feature_cls='getter') for features"
    )
