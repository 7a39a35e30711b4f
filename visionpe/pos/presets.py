"""PE presets by name: the table every backbone builds its positional encodings from.

A preset is a list of (PE kind, constructor kwargs); several kinds act together (e.g. RoPE + APE). Adding a PE means
adding its class to `PE_KINDS` and its presets to `PE_PRESETS`; backbones need no change.
"""

from __future__ import annotations

import difflib
import inspect

from .absolute import LearnedAPE, SinCos2D
from .ape_video import SpaceTimeAPE
from .base import PEHost, PosEncoding, PosStack
from .fuzzy import FuzzyPE
from .irpe import IRPE
from .lepe import LePE
from .peg import PEG
from .rope2d import RoPE2D
from .rope_nd import RoPEND

__all__ = ["PE_KINDS", "PE_PRESETS", "build_pos_encoding", "register_pe_kind", "register_pe_preset", "nearest"]

PE_KINDS: dict[str, type[PosEncoding]] = {
    "ape": LearnedAPE,
    "sincos": SinCos2D,
    "rope2d": RoPE2D,
    "irpe": IRPE,
    "cpe": PEG,
    "lepe": LePE,
    "fuzzy": FuzzyPE,
    "ape_st": SpaceTimeAPE,
    "rope_nd": RoPEND,
}

PE_PRESETS: dict[str, list[tuple[str, dict]]] = {
    "nope": [],
    "ape": [("ape", {})],
    "sincos": [("sincos", {})],
    "rope2d": [("rope2d", {"mode": "axial"})],
    "rope2d_mixed": [("rope2d", {"mode": "mixed"})],
    "rope2d_ape": [("rope2d", {"mode": "axial"}), ("ape", {})],
    "rope2d_mixed_ape": [("rope2d", {"mode": "mixed"}), ("ape", {})],
    # iRPE (DeiT default: contextual, product, on k, ratio 1.9, APE kept)
    "irpe": [("irpe", {"mode": "contextual", "mapping": "product", "targets": ("k",)}), ("ape", {})],
    "irpe_bias": [("irpe", {"mode": "bias", "mapping": "product", "targets": ("k",)}), ("ape", {})],
    "irpe_qkv": [("irpe", {"mode": "contextual", "mapping": "product", "targets": ("q", "k", "v")}), ("ape", {})],
    # conditional / local: PEG after block 0 (no APE; cpe_gap is the CPVT-GAP model: the backbone pools by average),
    # LePE on the values of every layer, ViTAR's fuzzy PE (fuzzy_atm: the backbone adds the token merger)
    "cpe": [("cpe", {"blocks": (0,)})],
    "cpe_gap": [("cpe", {"blocks": (0,)})],
    "lepe": [("lepe", {})],
    "fuzzy": [("fuzzy", {})],
    "fuzzy_atm": [("fuzzy", {})],
    # video / multimodal: separable space-time APE; RoPE over the position streams of visionpe.segments
    "ape_st": [("ape_st", {})],
    "rope1d": [("rope_nd", {"scheme": "rope1d"})],
    "rope3d": [("rope_nd", {"scheme": "rope3d"})],
    "mrope": [("rope_nd", {"scheme": "mrope"})],
    "videorope": [("rope_nd", {"scheme": "videorope"})],
    "vrope": [("rope_nd", {"scheme": "vrope"})],
    "v2pe": [("rope_nd", {"scheme": "v2pe"})],
    # Swin's relative position bias: iRPE bias, product mapping, identity index, B = window - 1, a table per head
    "rpb": [("irpe", {"mode": "bias", "mapping": "product", "index": "identity", "shared_heads": False})],
    # iRPE alone (contextual, product, on k), for backbones without an APE (Swin, CvT)
    "irpe_only": [("irpe", {"mode": "contextual", "mapping": "product", "targets": ("k",)})],
}


def register_pe_kind(name: str, cls: type[PosEncoding]) -> None:
    PE_KINDS[name] = cls


def register_pe_preset(name: str, parts: list[tuple[str, dict]]) -> None:
    PE_PRESETS[name] = parts


def nearest(name: str, choices, n: int = 3) -> str:
    """', '.join of the closest valid names, for error messages."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.4)
    return ", ".join(close) if close else ", ".join(sorted(choices)[:n])


def _accepted(cls: type[PosEncoding]) -> set[str]:
    return {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "host")}


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
        encodings[kind] = cls(host, **{**kwargs, **flat, **extra})
    unused = set(pe_kwargs) - used
    if unused:
        valid = set().union(*(_accepted(PE_KINDS[k]) for k in kinds)) if kinds else set()
        raise ValueError(
            f"pe_kwargs {sorted(unused)} are not taken by any PE of preset {preset!r}; valid keys: {sorted(valid)}"
        )
    return PosStack(host, encodings)
