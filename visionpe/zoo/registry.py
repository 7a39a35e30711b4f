"""The model zoo: size tables x PE presets -> pretrained cfgs -> timm registrations.

Every family declares one `Family` (visionpe.zoo.family: its size table, the PE presets it offers and its base
pretrained cfg); importing this module runs `register_family` on each, which generates `{family}_{size}_{pe}`
entrypoints and registers them with timm, so that `timm.create_model("vit_b_rope2d")` and
`timm.list_models("vit_*")` work. Nothing is written out by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import timm
from timm.models import build_model_with_cfg, generate_default_cfgs, get_pretrained_cfg, register_model

from ..pos.presets import PRESET_MODEL_OPTIONS, nearest, preset_cfg
from .checkpoint_filters import checked_filter
from .cvt_family import CVT
from .family import FAMILIES, Family
from .multimodal_family import MM
from .pretrained_cfgs import WEIGHTS, model_args_for
from .swin_family import SWIN
from .video_family import VIDEO
from .vit_family import VIT

__all__ = [
    "FAMILIES",
    "Family",
    "create_model",
    "expand_models",
    "family_of",
    "list_visionpe_models",
    "model_name",
    "name_parts",
    "register_family",
    "timm_equivalent",
]


_REGISTERED: dict[str, tuple[str, str, str]] = {}  # registered name -> (family, size, PE variant)


def model_name(family: str, size: str, pe: str) -> str:
    return f"{family}_{size}_{pe}" if pe else f"{family}_{size}"


def preset_model_options(model_kwargs: dict) -> dict:
    """Model options the PE preset of these model kwargs implies (e.g. CPVT-GAP's average pooling)."""
    return dict(PRESET_MODEL_OPTIONS.get(model_kwargs.get("pe", ""), {}))


def _selected_tag(name: str, pretrained: bool, pretrained_cfg) -> str | None:
    """The weights tag a create call selects: named (`name.tag` or pretrained_cfg="tag" or a cfg dict with a tag),
    else the default tag when pretrained=True; None for a plain architecture."""
    if isinstance(pretrained_cfg, str):
        return pretrained_cfg
    if pretrained_cfg is not None:
        return pretrained_cfg.get("tag") if isinstance(pretrained_cfg, dict) else getattr(pretrained_cfg, "tag", None)
    if pretrained:
        return get_pretrained_cfg(name).tag
    return None


def _entrypoint(family: Family, name: str, size: str, pe: str) -> Callable:
    def create(pretrained: bool = False, pretrained_cfg=None, **kwargs):
        trained_with = model_args_for(name, _selected_tag(name, pretrained, pretrained_cfg))
        args = {
            **family.sizes[size],
            **preset_model_options(family.pes[pe]),
            **family.pes[pe],
            **trained_with,
            **kwargs,
        }
        return build_model_with_cfg(
            family.model_cls,
            name,
            pretrained,
            pretrained_cfg=pretrained_cfg,
            pretrained_filter_fn=checked_filter(family.filter_fn),
            feature_cfg=dict(family.feature_cfg),
            **args,
        )

    create.__name__ = create.__qualname__ = name
    create.__module__ = family.module
    create.__doc__ = f"{family.name} size {size} with positional encoding {pe or 'default'!r}."
    return create


def register_family(family: Family) -> list[str]:
    """Register every size x PE of a family with timm; returns the names."""
    FAMILIES[family.name] = family
    for pe, kwargs in family.pes.items():  # each PE variant's paper comes from its preset (pos/presets.py)
        paper = preset_cfg(kwargs.get("pe", ""))
        if paper:
            family.pe_cfg[pe] = {**paper, **family.pe_cfg.get(pe, {})}
    mod = sys.modules[family.module]
    cfgs = {}
    for size in family.sizes:
        for pe in family.pes:
            name = model_name(family.name, size, pe)
            cfg = {**family.cfg, **family.size_cfg.get(size, {}), **family.pe_cfg.get(pe, {})}
            for tag, weights in WEIGHTS.get(name, {}).items():  # published weights: one cfg per tag
                cfgs[f"{name}.{tag}"] = {**cfg, **{k: v for k, v in weights.items() if k != "model_args"}}
            if name not in WEIGHTS:
                cfgs[name] = cfg
    generated = generate_default_cfgs(cfgs)
    if not hasattr(mod, "default_cfgs"):
        mod.default_cfgs = {}
    mod.default_cfgs.update(generated)
    names = []
    for size in family.sizes:
        for pe in family.pes:
            name = model_name(family.name, size, pe)
            fn = _entrypoint(family, name, size, pe)
            setattr(mod, name, fn)
            register_model(fn)
            names.append(name)
            _REGISTERED[name] = (family.name, size, pe)
    return names


def list_visionpe_models(pattern: str = "*") -> list[str]:
    """Names visionpe registered, filtered by a glob pattern."""
    from fnmatch import fnmatch

    return sorted(n for n in _REGISTERED if fnmatch(n, pattern))


def family_of(name: str) -> Family:
    """The Family a registered model name belongs to."""
    for fam in sorted(FAMILIES.values(), key=lambda f: -len(f.name)):
        if name.startswith(fam.name + "_") and name in _REGISTERED:
            return fam
    raise ValueError(f"{name!r} is not a visionpe model; nearest: {nearest(name, _REGISTERED)}")


def name_parts(name: str) -> tuple[str, str, str]:
    """(family, size, PE) of a registered name, a family's default variant by its preset (cvt_13: the PE the family
    builds without a suffix); (name, '', name) for a name outside the zoo."""
    if name not in _REGISTERED:
        return name, "", name
    family, size, pe = _REGISTERED[name]
    return family, size, pe or FAMILIES[family].pes[""].get("pe", "default")


def create_model(name: str, **kwargs):
    """`timm.create_model` with an error that names the nearest valid model names."""
    if not timm.is_model(name):
        raise ValueError(f"unknown model {name!r}; nearest visionpe models: {nearest(name, _REGISTERED)}")
    return timm.create_model(name, **kwargs)


def expand_models(patterns: list[str]) -> list[str]:
    """Model names with glob patterns ('vit_s_*') expanded over the registered visionpe models, order kept; timm's own
    names pass through. A pattern that matches nothing or an unknown name is a ValueError."""
    names: list[str] = []
    for p in patterns:
        if any(c in p for c in "*?["):
            if not (hits := list_visionpe_models(p)):
                raise ValueError(f"model pattern {p!r} matches no registered visionpe model")
            names += hits
        elif timm.is_model(p):
            names.append(p)
        else:
            create_model(p)  # raises, naming the nearest model names
    return list(dict.fromkeys(names))


def _timm_pairs() -> dict[str, str]:
    """ours -> timm's model of the same architecture, for the pairs timm has (not CvT, not most PEs)."""
    widths = {"t": "tiny", "s": "small", "b": "base", "l": "large"}
    pes = {"ape": "", "rope2d": "_rope", "rope2d_mixed": "_rope_mixed", "rope2d_ape": "_rope_ape",
           "rope2d_mixed_ape": "_rope_mixed_ape"}  # fmt: skip
    vit = {f"vit_{s}_{pe}": f"vit_{w}_patch16{theirs}_224" for s, w in widths.items() for pe, theirs in pes.items()}
    swin = {f"swin_{s}_rpb": f"swin_{w}_patch4_window7_224" for s, w in widths.items() if s != "l"}
    return {ours: ref for ours, ref in {**vit, **swin}.items() if timm.is_model(ref)}


TIMM_EQUIVALENTS = _timm_pairs()


def timm_equivalent(name: str) -> tuple[str, dict] | None:
    """(timm's model of the same architecture, the options ours takes to match it: those of our published weights,
    e.g. LayerScale for the RoPE-ViT ports), or None where timm has none (e.g. cvt_13)."""
    ref = TIMM_EQUIVALENTS.get(name)
    return None if ref is None else (ref, model_args_for(name, timm.get_pretrained_cfg(name).tag))


FAMILIES.update({family.name: family for family in (VIT, VIDEO, MM, SWIN, CVT)})

for _family in list(FAMILIES.values()):
    register_family(_family)
