"""timm's construction contract, shared by every backbone: factory kwargs, full re-initialisation, heads that keep
their place.

- `factory_kwargs`: a model's `__init__` takes `device=` and `dtype=` (timm >= 1.0.21 passes them to every model):
  the model is built inside `torch.device(device)` (directly there, also on "meta") and cast to `dtype` after.
  It also takes timm's size flags (`TIMM_SIZE_FLAGS`: dynamic_img_size, dynamic_img_pad, strict_img_size) for
  compatibility; every model here takes any input size and pads partial patches, whatever their value.
- `reset_to_defaults`: every submodule with a `reset_parameters()` (linear, conv, norm, embedding, LayerScale and
  each PE's own parameters) draws its parameters afresh; a backbone's `init_weights()` runs it before its own init,
  so that after `to_empty()` no parameter or buffer is left uninitialised. The constructor does not run it, so a
  model built from a seed draws exactly what it drew before this existed.
- `init_linears`: the ViT-style init of a module's linear layers (truncated normal, std 0.02; zero biases), in the
  order `modules()` visits them, the draws every backbone's `_init_layers` makes.
- `place_layer_pos`: each attention layer's positional state (`pe.layer(i)`) placed in its block (`attn.pos`).
- `place_like`: a rebuilt module (a new classifier) on the model's device and dtype, in its train / eval mode.
- `UnsupportedPool`: the error for a pool a model refuses; it is a ValueError and, for timm's checks, an
  AssertionError (what timm's own models raise there).
"""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch
from timm.layers import trunc_normal_
from torch import nn

from ..pos.base import PEHost
from ..pos.table_cache import invalidate_tables

__all__ = [
    "TIMM_SIZE_FLAGS",
    "ContractModel",
    "UnsupportedPool",
    "factory_kwargs",
    "init_linears",
    "not_scriptable",
    "layer_pos_no_weight_decay",
    "place_layer_pos",
    "place_like",
    "reset_to_defaults",
]


class UnsupportedPool(ValueError, AssertionError):
    """A global pool the model does not take (raised by the constructor and by reset_classifier alike)."""


TIMM_SIZE_FLAGS = ("dynamic_img_size", "dynamic_img_pad", "strict_img_size")


def factory_kwargs(init):
    """Decorate a model's `__init__` so it takes timm's `device=` / `dtype=` factory kwargs (and its size flags)."""

    @functools.wraps(init)
    def wrapped(self, *args, device=None, dtype=None, **kwargs):
        for flag in TIMM_SIZE_FLAGS:
            kwargs.pop(flag, None)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating-point torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
        with torch.device(device) if device is not None else nullcontext():
            init(self, *args, **kwargs)
        if dtype is not None:
            self.to(dtype=dtype)

    return wrapped


def reset_to_defaults(model: nn.Module) -> None:
    """Call `reset_parameters()` on every submodule of `model` that has one (not on `model` itself)."""
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if module is not model and callable(reset):
            reset()


def init_linears(module: nn.Module) -> None:
    """Every nn.Linear in `module` (itself included): weight ~ truncated normal (std 0.02), bias zero."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def place_layer_pos(pe: nn.Module, blocks) -> None:
    """blocks[i].attn.pos = pe.layer(i): layer i's positional state lives in its block (`blocks.{i}.attn.pos.*`)."""
    for i, block in enumerate(blocks):
        block.attn.pos = pe.layer(i)


def layer_pos_no_weight_decay(model: nn.Module) -> set[str]:
    """Names of every per-layer PE parameter its PE excludes from weight decay (`no_weight_decay` of the layer's
    module, where it has one), under the model's names."""
    out = set()
    for name, module in model.named_modules():
        if name.endswith("attn.pos"):
            for kind, own in module.items():
                skip = getattr(own, "no_weight_decay", None)
                out |= {f"{name}.{kind}.{n}" for n in (skip() if callable(skip) else ())}
    return out


def _place(model: nn.Module) -> dict:
    ref = next(model.parameters(), None)
    return {} if ref is None else dict(device=ref.device, dtype=ref.dtype)


def place_like(module: nn.Module, model: nn.Module) -> nn.Module:
    """`module` moved to the device / dtype of `model`'s parameters and set to `model`'s train / eval mode."""
    place = _place(model)
    if place:
        module = module.to(**place)
    return module.train(model.training)


def not_scriptable(model: nn.Module):
    """The error torch.jit.script gets (through `__prepare_scriptable__`): one line naming what works instead."""
    raise RuntimeError(
        f"{type(model).__name__} cannot be compiled with TorchScript (its positional encodings build layouts and "
        "closures per input size); use torch.compile(model) or torch.export.export(model, (x,)) instead"
    )


class ContractModel(nn.Module):
    """What every backbone shares of timm's model contract: a full re-init (`init_weights`, also after
    `to_empty()`: layer defaults, then the model's own `_init_layers`, then the buffers), the PEs' buffers rebuilt
    (`init_non_persistent_buffers`, which timm's `reinit_non_persistent_buffers` calls), activation checkpointing
    (`set_grad_checkpointing`) and the TorchScript error."""

    intermediate_formats: tuple[str, ...] = ("NCHW",)  # forward_intermediates' output formats, the default first

    def init_weights(self) -> None:
        """Every parameter and buffer drawn or computed afresh (also after `to_empty()`)."""
        reset_to_defaults(self)
        self._init_layers()
        self.init_non_persistent_buffers()

    def init_non_persistent_buffers(self) -> None:
        """The PEs' index / frequency buffers rebuilt (timm's reinit_non_persistent_buffers)."""
        self.pe.init_non_persistent_buffers()
        self.forget_pe_tables()

    def set_pe_host(self, host: PEHost, layers: tuple = ()) -> None:
        """The backbone changed (timm's set_input_size, pruning): its PEs adapt their parameters through `set_host`
        (layers: each block's `attn.pos`)."""
        self.pe.set_host(host, layers)
        self.forget_pe_tables()

    def forget_pe_tables(self, learned_only: bool = False) -> None:
        """The one place the PEs' cached tables are forgotten (visionpe.pos.table_cache): rebuilt buffers, a new
        host, position mode or state dict, and a switch of train / eval mode that changes it (learned tables only:
        a write their version does not show, FSDP's all-gather, may have happened while training)."""
        invalidate_tables(self, learned_only)

    def train(self, mode: bool = True):
        """A switch that changes the mode forgets the PEs' learned tables; eval -> eval keeps them."""
        if mode != self.training:
            self.forget_pe_tables(learned_only=True)
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs):
        self.forget_pe_tables()  # loaded values: no cached table of the old ones is reused
        return super()._load_from_state_dict(*args, **kwargs)

    def intermediate_format(self, output_fmt: str | None) -> str:
        """forward_intermediates' `output_fmt` checked against the model's `intermediate_formats` (None: the first)."""
        formats = self.intermediate_formats
        if output_fmt is None:
            return formats[0]
        if output_fmt not in formats:
            raise ValueError(f"output_fmt must be one of {formats}, got {output_fmt!r}")
        return output_fmt

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass (activation checkpointing) while training."""
        self.grad_checkpointing = enable

    def __prepare_scriptable__(self):
        not_scriptable(self)
