"""PE presets by name: the table every backbone builds its positional encodings from.

A preset is a list of (PE kind, constructor kwargs); several kinds act together (e.g. RoPE + APE). A kind's name is
its module and (lower-cased) class name (`cpe` -> pos/cpe.py, `CPE`). Adding a PE means one module in pos/, its class
in `PE_KINDS` and its presets in `PE_PRESETS` (`register_pe_kind` / `register_pe_preset` at runtime); backbones need
no change (docs/adding_a_pe.md walks through one).

One vocabulary: a preset name means the same PEs on every family, and no two presets share contents under different
names. Model-level options a preset implies (CPVT-GAP's average pooling, ViTAR's token merger) live in
`PRESET_MODEL_OPTIONS`, and each preset's paper in `PRESET_PAPERS` (read from the papers' table, visionpe/papers.py);
the zoo reads both from here. A model name's PE suffix is a preset's name; where a family sets an option of the
preset's PEs (Swin's RoPE theta 50, the video LieRE's three axes, the multimodal RoPEs' theta 10000) or reads its
positions its own way (window-local coordinates), the family's zoo table says so. One suffix names another preset:
`vivit_*_ape` is the space-time APE (`ape_st`), as the 2D table of `ape` has no time axis. `irpe` is iRPE with the
learned APE on every family (`vit_*_irpe`, `swin_*_irpe`, `cvt_*_irpe`); `irpe_k` is the same iRPE alone
(`swin_*_irpe_k` / `cvt_*_irpe_k` are what `swin_*_irpe` / `cvt_*_irpe` built before issue 43).
"""

from __future__ import annotations

import difflib
import inspect
import math

from ..papers import Paper, preset_papers
from .absolute import LearnedAPE, SinCos2D
from .alibi2d import ALiBi2D
from .ape_radio import CroppedAPE
from .ape_video import SpaceTimeAPE
from .base import PEHost, PosEncoding, PosStack
from .cpe import CPE
from .fire2d import FIRE2D
from .fourier import LearnableFourier
from .fuzzy import FuzzyPE
from .irpe import IRPE
from .lepe import LePE
from .lie_rope import LieRoPE
from .lookhere import LookHere
from .mhrope import MHRoPE
from .probe import probe_pe
from .rope2d import RoPE2D
from .rope2d_dinov3 import RoPE2DDinoV3
from .rope2d_spiral import RoPE2DSpiral
from .rope_nd import RoPEND
from .seqpe import SeqPE
from .string import STRING

__all__ = [
    "PE_KINDS",
    "PE_PRESETS",
    "PRESET_MODEL_OPTIONS",
    "PRESET_PAPERS",
    "Paper",
    "build_pos_encoding",
    "nearest",
    "preset_cfg",
    "register_pe_kind",
    "register_pe_preset",
]

PE_KINDS: dict[str, type[PosEncoding]] = {
    "ape": LearnedAPE,
    "sincos": SinCos2D,
    "rope2d": RoPE2D,
    "irpe": IRPE,
    "cpe": CPE,
    "lepe": LePE,
    "fuzzy": FuzzyPE,
    "ape_st": SpaceTimeAPE,
    "rope_nd": RoPEND,
    "rope2d_dinov3": RoPE2DDinoV3,
    "lie_rope": LieRoPE,
    "alibi2d": ALiBi2D,
    "lookhere": LookHere,
    "fire2d": FIRE2D,
    "string": STRING,
    "rope2d_spiral": RoPE2DSpiral,
    "lff": LearnableFourier,
    "ape_radio": CroppedAPE,
    "mhrope": MHRoPE,
    "seqpe": SeqPE,
}


def _lookhere(head_directions: str) -> dict:
    return dict(head_directions=head_directions, global_slope=2.0, layer_slopes=(1.5, 0.5))


PE_PRESETS: dict[str, list[tuple[str, dict]]] = {
    "nope": [],
    "ape": [("ape", {})],
    "sincos": [("sincos", {})],
    "rope2d": [("rope2d", {"mode": "axial"})],
    "rope2d_mixed": [("rope2d", {"mode": "mixed"})],
    # RoPE-ViT +APE: the APE resampled by plain bicubic, as naver's code does (timm's default antialiases)
    "rope2d_ape": [("rope2d", {"mode": "axial"}), ("ape", {"resample": "bicubic"})],
    "rope2d_mixed_ape": [("rope2d", {"mode": "mixed"}), ("ape", {"resample": "bicubic"})],
    # p-RoPE (Barbero et al.): the lowest quarter of each axis' / stream's frequencies dropped (the paper's best p);
    # `p` is an option of every rotary PE here (pe_kwargs=dict(p=...)), these presets its p = 0.75 on plain RoPE
    "rope2d_p": [("rope2d", {"mode": "axial", "p": 0.75})],
    # DINOv3's RoPE: patch centres in [-1, 1], periods 100^(k / (d/4)), rotate-half layout (no augmentation by
    # default; DINOv3's training draws rescale_coords=2, a pe_kwargs option)
    "rope2d_dinov3": [("rope2d_dinov3", {})],
    # learned rotations on 8 x 8 blocks (visionpe.pos.lie_rope): LieRE (non-commuting), ComRoPE-AP / -LD (commuting)
    "liere": [("lie_rope", {"variant": "liere"})],
    "comrope_ap": [("lie_rope", {"variant": "comrope_ap"})],
    "comrope_ld": [("lie_rope", {"variant": "comrope_ld"})],
    # STRING (visionpe.pos.string): a learned orthogonal basis change, then RoPE (Cayley: RoPE-Mixed's frequencies)
    "string_cayley": [("string", {"variant": "cayley"})],
    "string_circulant": [("string", {"variant": "circulant"})],
    # Spiral RoPE: pairs along K = 2R = 4 directions (0, 45, 90, 135 degrees); _ape: the paper's DeiT, APE kept
    "rope2d_spiral": [("rope2d_spiral", {})],
    "rope2d_spiral_ape": [("rope2d_spiral", {}), ("ape", {"resample": "bicubic"})],
    # iRPE (DeiT default: contextual, product, on k, ratio 1.9, APE kept; irpe_k: the same iRPE alone)
    "irpe": [("irpe", {"mode": "contextual", "mapping": "product", "targets": ("k",)}), ("ape", {})],
    "irpe_bias": [("irpe", {"mode": "bias", "mapping": "product", "targets": ("k",)}), ("ape", {})],
    "irpe_qkv": [("irpe", {"mode": "contextual", "mapping": "product", "targets": ("q", "k", "v")}), ("ape", {})],
    "irpe_k": [("irpe", {"mode": "contextual", "mapping": "product", "targets": ("k",)})],
    # conditional / local: a CPE after the first block of every stage (block 0 of a ViT; no APE), LePE on the values
    # of every layer, ViTAR's fuzzy PE; cpe_gap / fuzzy_atm: the same PEs with their papers' model options (below)
    "cpe": [("cpe", {})],
    "cpe_gap": [("cpe", {})],
    "lepe": [("lepe", {})],
    "fuzzy": [("fuzzy", {})],
    "fuzzy_atm": [("fuzzy", {})],
    # video / multimodal: separable space-time APE; RoPE over the position streams of visionpe.pos.mm_positions
    "ape_st": [("ape_st", {})],
    "rope1d": [("rope_nd", {"scheme": "rope1d"})],
    "rope3d": [("rope_nd", {"scheme": "rope3d"})],
    "rope1d_p": [("rope_nd", {"scheme": "rope1d", "p": 0.75})],
    "rope3d_p": [("rope_nd", {"scheme": "rope3d", "p": 0.75})],
    "mrope": [("rope_nd", {"scheme": "mrope"})],
    "mrope_time": [("rope_nd", {"scheme": "mrope_time"})],
    "videorope": [("rope_nd", {"scheme": "videorope"})],
    "vrope": [("rope_nd", {"scheme": "vrope"})],
    "v2pe": [("rope_nd", {"scheme": "v2pe"})],
    "mrope_interleaved": [("rope_nd", {"scheme": "mrope_interleaved"})],
    "hope": [("rope_nd", {"scheme": "hope"})],
    # Huang et al. (arXiv 2510.23095): the interleaved layout with spatial reset (h, w from 0 in every image /
    # frame), pairs interleaved (MRoPE-I) or one stream per head (MHRoPE, visionpe.pos.mhrope)
    "mrope_i": [("rope_nd", {"scheme": "mrope_interleaved", "scheme_options": {"spatial_reset": True}})],
    "mhrope": [("mhrope", {"scheme_options": {"spatial_reset": True}})],
    # Swin's relative position bias: iRPE bias, product mapping, identity index, B = window - 1, a table per head,
    # drawn from a truncated normal (std 0.02) as in Swin
    "rpb": [
        ("irpe", {"mode": "bias", "mapping": "product", "index": "identity", "shared_heads": False, "init_std": 0.02})
    ],
    # attention biases of the query-key offset (no APE): CROMA's 2D ALiBi, LookHere's directed fields of view
    # (LH-180 / 90 / 45: the slopes of the official ViT-B configs), FIRE in 2D (visionpe's definition)
    "alibi2d": [("alibi2d", {})],
    "lookhere": [("lookhere", _lookhere("halves-diagonals-none"))],
    "lookhere_90": [("lookhere", _lookhere("corners-triangles-none"))],
    "lookhere_45": [("lookhere", _lookhere("eighths1-eighths2-none"))],
    "fire2d": [("fire2d", {})],
    # absolute PEs of continuous coordinates / a larger table: learnable Fourier features (Li et al.), RADIO's CPE
    "lff": [("lff", {})],
    "ape_radio": [("ape_radio", {})],
    # SeqPE: positions as digit sequences read by a small causal transformer, multiplied into q and k (attn_mul)
    "seqpe": [("seqpe", {})],
}

# model-level options a preset implies (applied by the zoo; a backbone that lacks the option rejects the preset)
PRESET_MODEL_OPTIONS: dict[str, dict] = {
    "cpe_gap": dict(global_pool="avg", class_token=False, fc_norm=False),  # CPVT-GAP: norm, then mean over patches
    "fuzzy_atm": dict(token_merger=1),  # ViTAR: half-size patches merged to the patch grid (G = 14 at 224 / 16)
}


PRESET_PAPERS: dict[str, Paper] = preset_papers()  # preset -> its paper, from the one table (visionpe/papers.py)


def preset_cfg(preset: str) -> dict:
    """pretrained-cfg fields a preset contributes (its paper); {} for a preset without one (the backbone's)."""
    paper = PRESET_PAPERS.get(preset)
    return paper.cfg() if paper else {}


def register_pe_kind(name: str, cls: type[PosEncoding]) -> None:
    PE_KINDS[name] = cls


def register_pe_preset(
    name: str, parts: list[tuple[str, dict]], paper: Paper | None = None, model_options: dict | None = None
) -> None:
    """Add a preset (its PEs, optionally its paper and the model options it implies) under a new name."""
    unknown = [kind for kind, _ in parts if kind not in PE_KINDS]
    if unknown:
        raise ValueError(f"preset {name!r} uses unknown PE kinds {unknown}; register them with register_pe_kind")
    PE_PRESETS[name] = parts
    if paper is not None:
        PRESET_PAPERS[name] = paper
    if model_options:
        PRESET_MODEL_OPTIONS[name] = dict(model_options)


def nearest(name: str, choices, n: int = 3) -> str:
    """', '.join of the closest valid names, for error messages."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.4)
    return ", ".join(close) if close else ", ".join(sorted(choices)[:n])


def _accepted(cls: type[PosEncoding]) -> set[str]:
    return {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "host")}


def check_pe_options(cls: type[PosEncoding], options: dict) -> None:
    """Numeric options (and the numbers in list options) must be finite and >= 0, those in the class's
    `positive_options` > 0: theta=0 or NaN would give NaN positions, and a negative count no model."""
    for name, value in options.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            bound = 0 if name in cls.positive_options else None
            if not math.isfinite(v) or v < 0 or (bound is not None and v <= bound):
                need = "a finite number > 0" if bound is not None else "a finite number >= 0"
                raise ValueError(f"{cls.__name__} option {name}={value!r} must be {need} (pe_kwargs)")


def build_pos_encoding(preset: str, host: PEHost, pe_kwargs: dict | None = None) -> PosStack:
    """Build the PEs of `preset` for a backbone. `pe_kwargs` override constructor kwargs: a flat key goes to every
    PE kind that accepts it; `{"kind": {...}}` targets one kind (e.g. `{"rope2d": {"theta": 50}}`)."""
    if preset not in PE_PRESETS:
        raise ValueError(f"unknown positional encoding {preset!r}; nearest: {nearest(preset, PE_PRESETS)}")
    pe_kwargs = dict(pe_kwargs or {})
    parts = PE_PRESETS[preset]
    kinds = [kind for kind, _ in parts]
    targeted = {k: pe_kwargs.pop(k) for k in list(pe_kwargs) if k in PE_KINDS}
    for kind in targeted:
        if kind not in kinds:
            raise ValueError(f"pe_kwargs names {kind!r}, which preset {preset!r} does not use (it uses {kinds})")
    used = set()
    encodings = {}
    for kind, kwargs in parts:
        cls = PE_KINDS[kind]
        accepted = _accepted(cls)
        flat = {k: v for k, v in pe_kwargs.items() if k in accepted}
        used |= flat.keys()
        extra = targeted.get(kind, {})
        unknown = set(extra) - accepted
        if unknown:
            raise ValueError(f"{cls.__name__} does not take {sorted(unknown)}; it takes {sorted(accepted)}")
        options = {**kwargs, **flat, **extra}
        check_pe_options(cls, options)
        encodings[kind] = cls(host, **options)
        probe_pe(encodings[kind], options)
    unused = set(pe_kwargs) - used
    if unused:
        valid = set().union(*(_accepted(PE_KINDS[k]) for k in kinds)) if kinds else set()
        raise ValueError(
            f"pe_kwargs {sorted(unused)} are not taken by any PE of preset {preset!r}; valid keys: {sorted(valid)}"
        )
    return PosStack(host, encodings)
