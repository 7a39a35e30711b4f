"""The positional-encoding interface: five sites where a PE can act, and what a backbone tells a PE about itself.

| site    | hook                            | e.g.                               |
|---------|---------------------------------|------------------------------------|
| tokens  | `tokens(x, layout)`             | learned APE, sin-cos, fuzzy PE     |
| qk      | `context(...).rotate(q, k)`     | RoPE variants                      |
| logits  | `context(...).bias(q, k)`       | iRPE, Swin relative position bias  |
| values  | `context(...).value(v, o, p)`   | LePE, iRPE on v                    |
| block   | `block(i, x, layout)`           | CPE / PEG                          |

Attention receives one `PosContext` per layer and never branches on a PE's name.

The host contract, one way: the backbone describes itself in a `PEHost` and hands it to its PEs (at construction,
and again through `set_host` whenever it changes, e.g. timm's `set_input_size` with a new image or window size);
it calls `init_weights()` from its own init. A PE owns its parameters (their names, shapes, init and resizing) and
declares what it needs from the backbone: `layout_scheme` (the position streams its layouts must carry) and
`layout_options(training)` (per-forward options of that scheme). No backbone names a PE's parameters or presets:
a PE converts its own entries of published checkpoints (`checkpoint_keys`, `convert_checkpoint`; the backbone's
filter hands them over through visionpe.pos.checkpoint) and says which layer each parameter serves (`layer_of`, for
layer-wise lr decay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..attn_inputs import PosContext  # attention's input type, built by the PEs
from ..layout import TokenLayout

__all__ = [
    "EVERY_LAYER",
    "AttnSpec",
    "CheckpointMismatch",
    "CheckpointSource",
    "PEHost",
    "PosContext",
    "PosEncoding",
    "PosStack",
    "merge_contexts",
    "nonfinite_error",
    "nonfinite_tensor",
]

EVERY_LAYER = "every layer"  # `layer_of`: one tensor serves every layer (layer decay: the top group, as timm's eva)


class CheckpointMismatch(ValueError):
    """The checkpoint does not fit the model it is loaded into (architecture, size or options differ)."""


@dataclass(frozen=True)
class CheckpointSource:
    """A published checkpoint as a backbone's filter describes it to its PEs.

    layout: how its keys are named ("vit": timm's ViT / DeiT / eva, DINOv3, naver's RoPE-ViT and the iRPE authors'
    DeiT; "swin": timm's and the official Swin); pe_name: the model's PE preset (for the messages); describe: a
    one-line guess of what the checkpoint is (for the messages)."""

    layout: str
    pe_name: str
    describe: Callable[[], str] = lambda: "a checkpoint of another layout"


@dataclass(frozen=True)
class AttnSpec:
    """One attention layer as a PE sees it. `grid` is the (H, W) the layer attends over at the reference size
    (the window for windowed attention); `dim` is the token width of the block around it."""

    dim: int
    num_heads: int
    head_dim: int
    grid: tuple[int, int] | None = None


@dataclass(frozen=True)
class PEHost:
    """What a backbone tells its PEs: token width, reference grid, prefix tokens and one AttnSpec per block."""

    dim: int
    grid: tuple[int, int]
    num_prefix: int
    layers: tuple[AttnSpec, ...]
    embed_prefix: bool = True  # learned APE also has entries for prefix tokens (timm DeiT); False = no_embed_class
    frames: int = 1  # token frames T of the reference grid (video trunks; 1 for images)
    stage_starts: tuple[int, ...] = (0,)  # index of the first block of each stage (hierarchical backbones)
    position_mode: str = "extrapolate"  # the backbone's test-time position mode (ntk / yarn: rotary PEs rescale)
    # the training input as a segment spec (visionpe.pos.mm_positions), which RoPE-ND's ntk / yarn compare a
    # layout's position spread with: the multimodal encoder's reference sequence; None: the reference clip alone
    reference_segments: tuple | None = None

    @property
    def depth(self) -> int:
        return len(self.layers)


def nonfinite_tensor(pe: nn.Module, buffers: bool = True) -> str | None:
    """'its <name> is not finite' for the first float parameter of `pe` holding inf or NaN, or buffer holding NaN,
    else None. A buffer may hold inf on purpose (p-RoPE's dropped periods: no rotation); an inf that overflowed shows
    in the PE's output, which the build probe checks."""
    for name, t in pe.named_parameters():
        if t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all()):
            return f"its {name!r} is not finite"
    for name, t in pe.named_buffers() if buffers else ():
        if t.is_floating_point() and t.device.type != "meta" and bool(torch.isnan(t).any()):
            return f"its {name!r} is not a number"
    return None


def nonfinite_error(pe: nn.Module, what: str) -> ValueError:
    """The one-line error for a PE whose options make a non-finite number (`what`: what was found where)."""
    options = getattr(pe, "built_with", {})
    shown = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "its defaults"
    return ValueError(
        f"{type(pe).__name__} with {shown}: {what}, an option overflows float32; use smaller values (pe_kwargs)"
    )


def _chain_rotate(f, g):
    def rotate(q, k):
        return g(*f(q, k))

    return rotate


def _sum_bias(f, g):
    return lambda q, k: f(q, k) + g(q, k)


def _chain_value(f, g):
    return lambda v, out, probs: g(v, f(v, out, probs), probs)


def merge_contexts(contexts: list[PosContext | None]) -> PosContext | None:
    """Combine the contexts of several PEs: rotations compose, biases add, value terms accumulate."""
    contexts = [c for c in contexts if c is not None]
    if not contexts:
        return None
    if len(contexts) == 1:
        return contexts[0]
    out = PosContext()
    for c in contexts:
        if c.rotate is not None:
            out.rotate = c.rotate if out.rotate is None else _chain_rotate(out.rotate, c.rotate)
        if c.bias is not None:
            out.bias = c.bias if out.bias is None else _sum_bias(out.bias, c.bias)
        if c.value is not None:
            out.value = c.value if out.value is None else _chain_value(out.value, c.value)
        out.needs_probs = out.needs_probs or c.needs_probs
    return out


class PosEncoding(nn.Module):
    """Base class of every PE. Override the sites the PE acts at; the defaults do nothing."""

    layout_scheme: str | None = None  # position scheme its layouts must follow (visionpe.pos.mm_positions); None: any
    # numeric constructor options must be finite and >= 0 (checked by build_pos_encoding); these must be > 0
    positive_options: tuple[str, ...] = ()
    # keys of published checkpoints (a regex per CheckpointSource.layout) that hold this kind of PE's parameters
    checkpoint_keys: dict[str, str] = {}
    # keys of published checkpoints that hold this kind of PE's buffers (rebuilt from the options): always dropped
    checkpoint_buffers: dict[str, str] = {}

    def __init__(self, host: PEHost):
        super().__init__()
        self.host = host

    def set_host(self, host: PEHost) -> None:
        """The backbone changed (timm's set_input_size: image, patch or window size): adapt the parameters to it.
        The default resamples grid-shaped tables through `set_grid`; PEs with per-layer shapes override this."""
        self.host = host
        self.set_grid(host.grid)

    def init_weights(self) -> None:
        """Called by the backbone's init after its own layers (parameters the PE's options say to draw)."""

    def reset_parameters(self) -> None:
        """Give this PE's own parameters their constructor values again (e.g. after `to_empty()`): the backbone's
        `init_weights()` calls it, then `init_weights()`. Submodules with a `reset_parameters` of their own (a
        conv) are reset by the backbone. Default: nothing, for PEs without parameters of their own; a PE whose
        constructor draws or fills a parameter must override it."""

    def init_non_persistent_buffers(self) -> None:
        """Rebuild every non-persistent buffer (index, frequency tables) from the PE's configuration on the
        buffers' device, and drop every cache computed from them. Called after `to_empty()` + `load_state_dict`
        (timm's `reinit_non_persistent_buffers` calls it on every module that has it) and by the backbone's
        `init_weights()`. Default: nothing, for PEs without buffers or caches; a PE that registers a
        non-persistent buffer or keeps a cache must override it."""

    def keep_layers(self, depth: int) -> None:
        """The backbone dropped every attention layer from `depth` on (timm's `prune_intermediate_layers`,
        `features_only`): drop their per-layer state, so that every parameter left is used. The default updates
        the host; a PE with per-layer parameters must also drop those of the removed layers."""
        self.host = replace(self.host, layers=self.host.layers[:depth])

    def layout_options(self, training: bool) -> dict:
        """Per-forward options of `layout_scheme` (e.g. V2PE's visual step, drawn in training)."""
        return {}

    def tokens(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """Site 'tokens': x [B, P + N, C] right after the patch embedding (prefix tokens included)."""
        return x

    def block(self, i: int, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """Site 'block': x [B, P + N, C] after block i."""
        return x

    def context(self, i: int, layout: TokenLayout, kv_layout: TokenLayout | None = None) -> PosContext | None:
        """Sites 'qk', 'logits', 'values' for attention layer i. kv_layout: the keys' layout when it differs."""
        return None

    def set_grid(self, grid: tuple[int, int]) -> None:
        """A new reference grid (timm's set_input_size): learned tables are resampled to it."""

    def regrid_table(self, name: str, grid, resample) -> None:
        """`set_grid` of a PE with one learned grid table, the parameter `name`: at a new grid it becomes
        `resample(grid)` (computed before `self.grid` moves), a new parameter with no history and the old one's
        requires_grad."""
        grid = tuple(grid)
        if grid == self.grid:
            return
        with torch.no_grad():
            table = resample(grid).detach().clone()
        setattr(self, name, nn.Parameter(table, requires_grad=getattr(self, name).requires_grad))
        self.grid = grid

    def no_weight_decay(self) -> set[str]:
        """Parameter names (relative to this module) to exclude from weight decay."""
        return set()

    def layer_of(self, name: str) -> int | str | None:
        """The attention layer parameter `name` (relative to this module) serves, for layer-wise lr decay: an index
        (the group of that block), EVERY_LAYER (one tensor for all layers) or None (shared: the stem group). Default:
        the first all-digit component of the name (`tables.k.{i}`, `convs.{i}.weight`); None without one."""
        return next((int(part) for part in name.split(".") if part.isdigit()), None)

    def layer_parameters(self, i: int) -> list[nn.Parameter]:
        """The parameters that serve attention layer i alone and are read only in `context(i, ...)` and at site
        'block' after block i: under FSDP2 they shard in one group with block i (gathered for that step only,
        `visionpe.layers.layer_group`). Parameters of several layers (one tensor for all, a stage's shared MLP) or
        read elsewhere (site 'tokens') stay with the model's root group. Default: none."""
        return []

    def convert_checkpoint(self, entries: dict[str, torch.Tensor], source: CheckpointSource) -> dict:
        """This PE's entries of a published checkpoint (keys matching `checkpoint_keys[source.layout]`, maybe none)
        -> {parameter name relative to this module: tensor}, renamed, reshaped and resampled. Raise
        CheckpointMismatch naming the option or preset to use when they do not fit this PE's options."""
        if entries:
            raise CheckpointMismatch(self.absent_message(next(iter(entries)), source))
        return {}

    @classmethod
    def absent_message(cls, key: str, source: CheckpointSource) -> str:
        """The error when a checkpoint holds this kind of PE's entry `key` but the model's PE has none."""
        return f"the checkpoint has {key!r} ({cls.__name__}) but the model's PE {source.pe_name!r} has none"


class PosStack(PosEncoding):
    """Several PEs acting together (e.g. RoPE + APE); the model holds exactly one of these as `pe`."""

    def __init__(self, host: PEHost, encodings: dict[str, PosEncoding]):
        super().__init__(host)
        self.encodings = nn.ModuleDict(encodings)

    @property
    def names(self) -> list[str]:
        return list(self.encodings.keys())

    def tokens(self, x, layout):
        for pe in self.encodings.values():
            x = pe.tokens(x, layout)
        return x

    def block(self, i, x, layout):
        for pe in self.encodings.values():
            x = pe.block(i, x, layout)
        return x

    def context(self, i, layout, kv_layout=None):
        return merge_contexts([pe.context(i, layout, kv_layout) for pe in self.encodings.values()])

    def set_grid(self, grid):
        for pe in self.encodings.values():
            pe.set_grid(grid)

    def set_host(self, host):
        self.host = host
        for pe in self.encodings.values():
            pe.set_host(host)

    def init_weights(self):
        for pe in self.encodings.values():
            pe.init_weights()
            # an init std that overflows (the constructor's draws: probe_pe); buffers are rebuilt after this
            what = nonfinite_tensor(pe, buffers=False)
            if what:
                raise nonfinite_error(pe, what)

    def reset_parameters(self):  # the backbone's walk over its modules resets every PE of the stack itself
        pass

    def init_non_persistent_buffers(self):
        for pe in self.encodings.values():
            pe.init_non_persistent_buffers()

    def keep_layers(self, depth):
        super().keep_layers(depth)
        for pe in self.encodings.values():
            pe.keep_layers(depth)

    @property
    def layout_scheme(self) -> str | None:
        schemes = {pe.layout_scheme for pe in self.encodings.values()} - {None}
        if len(schemes) > 1:
            raise ValueError(f"PEs read different position schemes {sorted(schemes)}; combine at most one")
        return schemes.pop() if schemes else None

    def layout_options(self, training):
        return {k: v for pe in self.encodings.values() for k, v in pe.layout_options(training).items()}

    def no_weight_decay(self):
        return {f"encodings.{name}.{p}" for name, pe in self.encodings.items() for p in pe.no_weight_decay()}

    def layer_parameters(self, i):
        return [p for pe in self.encodings.values() for p in pe.layer_parameters(i)]

    def layer_of(self, name):
        _, kind, rest = name.split(".", 2)  # encodings.<kind>.<name>
        return self.encodings[kind].layer_of(rest)
