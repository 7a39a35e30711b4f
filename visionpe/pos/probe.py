"""A PE's numbers checked when it is built: an option can be finite and still overflow float32 inside the PE
(ALiBi's slope_scale=1e300 makes an infinite slope, and inf * 0 a NaN logit), so every parameter and buffer must be
finite, and so must the PE's output at each of its sites for a small input of the host's reference grid, in
training and in evaluation mode. The probe runs with the global random state saved and restored, so a model built
from a seed draws what it drew before."""

from __future__ import annotations

import torch

from ..layout.tokens import TokenLayout, image_layout, video_layout
from .base import PosEncoding, nonfinite_error, nonfinite_tensor

__all__ = ["probe_pe"]

_PROBE_GRID = 4  # probe grids are the reference grid, cut to at most this many cells a side (a cheap probe)


def _device(pe: PosEncoding) -> torch.device:
    tensors = [*pe.parameters(), *pe.buffers()]
    return tensors[0].device if tensors else torch.empty(0).device  # (a torch.device context's device)


def _layout(pe: PosEncoding, grid: tuple[int, int] | None, device) -> TokenLayout:
    host = pe.host
    h, w = (min(s, _PROBE_GRID) for s in (grid or host.grid))
    if host.frames > 1:
        return video_layout(min(host.frames, 2), h, w, host.num_prefix, device)
    return image_layout(h, w, host.num_prefix, device)


def _sites(pe: PosEncoding, device) -> str | None:
    """What is not finite at the first site whose output is not (for the message), or None."""
    gen = torch.Generator().manual_seed(0)

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    host = pe.host
    layout = _layout(pe, None, device)
    if not torch.isfinite(pe.tokens(draw(1, layout.num_tokens, host.dim), layout)).all():
        return "its tokens are not finite"
    for i, spec in enumerate(host.layers):
        layout = _layout(pe, spec.grid, device)
        n = layout.num_tokens
        own = pe.layer(i)  # a layer's own state as the options build it (the caller forks the RNG)
        own = own.to(device).train(pe.training) if own is not None else None
        what = nonfinite_tensor(own) if own is not None else None
        if what:
            return f"at layer {i} {what}"
        if not torch.isfinite(pe.block(i, draw(1, n, spec.dim), layout, own)).all():
            return f"its block output at layer {i} is not finite"
        ctx = pe.context(i, layout, None, own)
        if ctx is None:
            continue
        q, k, v = (draw(1, spec.num_heads, n, spec.head_dim) for _ in range(3))
        if ctx.rotate is not None:
            q, k = ctx.rotate(q, k)
            if not (torch.isfinite(q).all() and torch.isfinite(k).all()):
                return f"its rotated queries / keys at layer {i} are not finite"
        logits = q @ k.transpose(-1, -2) * spec.head_dim**-0.5
        if ctx.bias is not None:
            logits = logits + ctx.bias(q, k)
            if not torch.isfinite(logits).all():
                return f"its logits bias at layer {i} is not finite"
        probs = logits.softmax(-1)
        if ctx.value is not None and not torch.isfinite(ctx.value(v, probs @ v, probs)).all():
            return f"its value term at layer {i} is not finite"
    return None


def probe_pe(pe: PosEncoding, options: dict) -> None:
    """Raise a one-line ValueError when PE `pe`, just built with `options`, holds or makes a non-finite number."""
    pe.built_with = dict(options)  # for the messages (also those of a later init_weights: PosStack)
    device = _device(pe)
    if device.type == "meta":
        return  # nothing to compute (the model is materialised and re-initialised later)
    what = nonfinite_tensor(pe)
    if what is None and pe.layout_scheme is None:  # a scheme's layouts come from the multimodal encoder: not probed
        was_training = pe.training
        devices = [device] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                for training in (True, False):
                    what = _sites(pe.train(training), device)
                    if what:
                        break
        except (RuntimeError, OverflowError) as e:  # e.g. a jitter range float32 cannot hold
            what = f"a small probe input fails ({str(e).splitlines()[0]})"
        finally:
            pe.train(was_training)
    if what:
        raise nonfinite_error(pe, what)
