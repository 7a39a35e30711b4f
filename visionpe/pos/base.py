"""The positional-encoding interface: five sites where a PE can act, and what a backbone tells a PE about itself.

| site    | hook                            | e.g.                               |
|---------|---------------------------------|------------------------------------|
| tokens  | `tokens(x, layout)`             | learned APE, sin-cos, fuzzy PE     |
| qk      | `context(...).rotate(q, k)`     | RoPE variants                      |
| logits  | `context(...).bias(q, k)`       | iRPE, Swin relative position bias  |
| values  | `context(...).value(v, o, p)`   | LePE, iRPE on v                    |
| block   | `block(i, x, layout, own)`      | CPE / PEG                          |

Attention receives one `PosContext` per layer and never branches on a PE's name.

Each layer owns its state: `layer(i)` builds the module holding what serves attention layer i alone (iRPE tables,
LePE / CPE convs, LieRE generators, per-layer RoPE-Mixed frequencies), which the backbone places in that layer's
attention (`blocks[i].attn.pos`, a `LayerPos`: one entry per PE kind that has state there). Per forward the backbone
builds one `Positions` (the PE and the layouts, shared by every layer) and each block turns it into its context
inside its own forward (`positions.context(attn.pos)`), so the block's parameters are all it reads: FSDP shards
whole blocks, timm's block regexes group them, pruning slices the blocks. The model-level PE keeps only what layers
share (fixed cos / sin tables, FIRE's stage MLPs) or what acts on tokens (APE).

The host contract, one way: the backbone describes itself in a `PEHost` and hands it to its PEs (at construction,
and again through `set_host` whenever it changes, e.g. timm's `set_input_size` with a new image or window size);
it calls `init_weights()` from its own init. A PE owns its parameters (their names, shapes, init and resizing) and
declares what it needs from the backbone: `layout_scheme` (the position streams its layouts must carry) and
`layout_options(training)` (per-forward options of that scheme). No backbone names a PE's parameters or presets:
a PE converts its own entries of published checkpoints (`checkpoint_keys`, `convert_checkpoint`; the backbone's
filter hands them over through visionpe.pos.checkpoint) under flat names (`tables.k.{i}`, as the model-level PE
held them before each layer owned its state), which `layer_names` places under layer i's module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..attention.inputs import LayerPositions, PosContext  # attention's input types, built by the PEs
from ..layout.tokens import TokenLayout
from ..position_modes import EXTRAPOLATE

__all__ = [
    "AttnSpec",
    "CheckpointMismatch",
    "CheckpointSource",
    "LayerParams",
    "LayerPos",
    "PEHost",
    "PosContext",
    "Positions",
    "PosEncoding",
    "PosStack",
    "merge_contexts",
    "nonfinite_error",
    "nonfinite_tensor",
]


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
    """What a backbone tells its PEs about its geometry: token width, reference grid and input, prefix tokens and one
    AttnSpec per block. Runtime state (the position mode) is not here: see `PosEncoding.position_mode`."""

    dim: int
    grid: tuple[int, int]
    num_prefix: int
    layers: tuple[AttnSpec, ...]
    embed_prefix: bool = True  # learned APE also has entries for prefix tokens (timm DeiT); False = no_embed_class
    frames: int = 1  # token frames T of the reference grid (video trunks; 1 for images)
    stage_starts: tuple[int, ...] = (0,)  # index of the first block of each stage (hierarchical backbones)
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
    # the model's test-time position mode (visionpe.position_modes; ntk / yarn / riflex: rotary PEs rescale): runtime
    # state, like `training`, which the model's `set_position_mode` sets on every PE of its stack
    position_mode: str = EXTRAPOLATE

    def __init__(self, host: PEHost):
        super().__init__()
        self.host = host

    def set_host(self, host: PEHost, layers: tuple = ()) -> None:
        """The backbone changed (timm's set_input_size: image, patch or window size): adapt the parameters to it.
        layers: each attention layer's `layer(i)` module (None where it has none), to resize per-layer tables.
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
        buffers' device. Called after `to_empty()` + `load_state_dict` (timm's `reinit_non_persistent_buffers`
        calls it on every module that has it) and by the backbone's `init_weights()`. Default: nothing, for PEs
        without buffers; a PE that registers a non-persistent buffer must override it. Tables computed from buffers
        or parameters are kept in a `TableCache` (visionpe.pos.table_cache), which the backbone forgets."""

    def layer(self, i: int) -> nn.Module | None:
        """The module holding what serves attention layer i alone (its parameters and buffers), built once by
        the backbone and kept in that layer's attention; `context` and `block` get it back as `own`. Default: None
        (nothing per layer)."""
        return None

    def layout_options(self, training: bool) -> dict:
        """Per-forward options of `layout_scheme` (e.g. V2PE's visual step, drawn in training)."""
        return {}

    def tokens(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """Site 'tokens': x [B, P + N, C] right after the patch embedding (prefix tokens included)."""
        return x

    def block(self, i: int, x: torch.Tensor, layout: TokenLayout, own: nn.Module | None = None) -> torch.Tensor:
        """Site 'block': x [B, P + N, C] after block i (own: `layer(i)`'s module)."""
        return x

    def context(
        self, i: int, layout: TokenLayout, kv_layout: TokenLayout | None = None, own: nn.Module | None = None
    ) -> PosContext | None:
        """Sites 'qk', 'logits', 'values' for attention layer i. kv_layout: the keys' layout when it differs;
        own: `layer(i)`'s module."""
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

    def aux_loss(self) -> torch.Tensor | None:
        """A training objective of the PE's own, computed in the last training forward (the trainer adds it to the
        task loss), or None. Default: None."""
        return None

    # flat names of per-layer tensors (what `convert_checkpoint` returns, and the keys under `pe.encodings.<kind>.`
    # before each layer owned its state): a regex with the group `i` (the layer) -> the name in layer i's module
    layer_names: dict[str, str] = {}

    def layer_entries(self, flat: dict[str, torch.Tensor]) -> tuple[dict, dict[int, dict]]:
        """Flat names -> ({name in this module: tensor}, {layer i: {name in layer i's module: tensor}}), through
        `layer_names` (a regex's other groups fill its template: `tables\\.(?P<t>[kqv])\\.(?P<i>\\d+)` -> `{t}`)."""
        own, layers = {}, {}
        for name, value in flat.items():
            for pattern, template in self.layer_names.items():
                m = re.fullmatch(pattern, name)
                if m:
                    groups = m.groupdict()
                    layers.setdefault(int(groups.pop("i")), {})[template.format(**groups)] = value
                    break
            else:
                own[name] = value
        return own, layers

    def convert_checkpoint(self, entries: dict[str, torch.Tensor], source: CheckpointSource) -> dict:
        """This PE's entries of a published checkpoint (keys matching `checkpoint_keys[source.layout]`, maybe none)
        -> {flat name: tensor} (see `layer_names`), renamed, reshaped and resampled. Raise
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

    def layer(self, i):
        """A LayerPos with the layer-i module of each PE that has one (by kind), maybe none."""
        return LayerPos(i, {kind: m for kind, pe in self.encodings.items() if (m := pe.layer(i)) is not None})

    def block(self, i, x, layout, own=None):
        for kind, pe in self.encodings.items():
            x = pe.block(i, x, layout, _part(own, kind))
        return x

    def context(self, i, layout, kv_layout=None, own=None):
        return merge_contexts(
            [pe.context(i, layout, kv_layout, _part(own, kind)) for kind, pe in self.encodings.items()]
        )

    def set_grid(self, grid):
        for pe in self.encodings.values():
            pe.set_grid(grid)

    def set_host(self, host, layers=()):
        self.host = host
        for kind, pe in self.encodings.items():
            pe.set_host(host, tuple(_part(own, kind) for own in layers))

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

    def aux_loss(self):
        losses = [loss for pe in self.encodings.values() if (loss := pe.aux_loss()) is not None]
        return sum(losses[1:], losses[0]) if losses else None


def _part(own: nn.Module | None, kind: str) -> nn.Module | None:
    return own[kind] if own is not None and kind in own else None


def assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """param.copy_(value) for a plain or a sharded (FSDP2 DTensor) parameter; value: the whole tensor."""
    mesh = getattr(param, "device_mesh", None)
    if mesh is not None:
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(param.device, param.dtype), mesh, param.placements)
    param.copy_(value)


class LayerParams(nn.Module):
    """A layer's own learned tensors, drawn by `initial()` ({name: value}) at construction and by
    `reset_parameters`; excluded from weight decay unless `decay`."""

    def __init__(self, initial: Callable[[], dict[str, torch.Tensor]], decay: bool = True):
        super().__init__()
        self._initial, self._decay = initial, decay
        for name, value in initial().items():
            self.register_parameter(name, nn.Parameter(value))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for name, value in self._initial().items():
                assign(getattr(self, name), value)

    def no_weight_decay(self) -> set[str]:
        return set() if self._decay else {name for name, _ in self.named_parameters()}


class LayerPos(nn.ModuleDict):
    """Attention layer i's positional state (`attn.pos`): the `layer(i)` module of each PE kind that has one."""

    def __init__(self, index: int, modules: dict[str, nn.Module]):
        super().__init__(modules)
        self.index = index


@dataclass
class Positions(LayerPositions):
    """What every layer of one forward shares: the model's PE and the layouts (kv_layout: the keys' when they
    differ; extra: a context every layer adds, e.g. Swin's shift mask). A block turns it into its own context."""

    pe: PosEncoding
    layout: TokenLayout
    kv_layout: TokenLayout | None = None
    extra: PosContext | None = None

    def context(self, own: LayerPos) -> PosContext | None:
        """Layer `own.index`'s context (called inside its block's forward, where its parameters are gathered)."""
        return merge_contexts([self.pe.context(own.index, self.layout, self.kv_layout, own), self.extra])

    def block(self, own: LayerPos, x: torch.Tensor, layout: TokenLayout | None = None) -> torch.Tensor:
        """Site 'block' after layer `own.index` (layout: the tokens' when not the attention's, e.g. Swin windows)."""
        return self.pe.block(own.index, x, self.layout if layout is None else layout, own)
