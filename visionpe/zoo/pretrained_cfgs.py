"""Published weights each visionpe model can load: model name -> tag -> pretrained cfg (where the weights are, their
data config) plus `model_args`, the options the weights were trained with (LayerScale, APE without a CLS entry, the
activation). `timm.create_model("name.tag", pretrained=True)` finds the weights; the filters in *_weights.py map
each source's layout onto ours; the zoo merges `model_args` into the model kwargs when a tag is selected (by name,
or by default when pretrained=True), explicit kwargs winning.

Every source's location is a fact carried over from the publisher (timm's Hugging Face hub copies, the authors'
release urls); the first tag listed for a model is its default.
"""

from __future__ import annotations

from timm.data import IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD

from ..papers import paper

__all__ = ["WEIGHTS", "model_args_for"]

_HUB = "https://huggingface.co"
_SWIN_RELEASE = "https://github.com/SwinTransformer/storage/releases/download"
_INCEPTION = dict(mean=IMAGENET_INCEPTION_MEAN, std=IMAGENET_INCEPTION_STD)  # big_vision's ViTs: pixels in [-1, 1]

DEIT = dict(**paper("2012.12877").cfg(), crop_pct=0.875)
AUGREG = dict(
    **paper("2106.10270").cfg(),
    crop_pct=0.9,
    **_INCEPTION,
)


def _timm(arch: str, tag: str, **cfg) -> dict:
    """Weights timm publishes on its Hugging Face hub (already in timm's key layout)."""
    return dict(hf_hub_id=f"timm/{arch}.{tag}", **cfg)


def _vit() -> dict[str, dict[str, dict]]:
    w: dict[str, dict[str, dict]] = {}
    for size, deit, vit in (("t", "tiny", "tiny"), ("s", "small", "small"), ("b", "base", "base")):
        arch = f"deit_{deit}_patch16_224"
        w[f"vit_{size}_ape"] = {
            "fb_in1k": _timm(
                arch, "fb_in1k", url=f"https://dl.fbaipublicfiles.com/deit/{arch}-{_DEIT_HASH[deit]}.pth", **DEIT
            )
        }
        arch = f"vit_{vit}_patch16_224"
        for tag in _AUGREG_TAGS[size]:
            classes = dict(num_classes=21843) if tag.endswith("in21k") else {}
            w[f"vit_{size}_ape"][tag] = _timm(arch, tag, **AUGREG, **classes)
    w["vit_l_ape"] = {tag: _timm("vit_large_patch16_224", tag, **AUGREG) for tag in ("augreg_in21k_ft_in1k",)}

    # RoPE-ViT (DeiT-III recipe: LayerScale 1e-5; APE tables without a CLS entry). timm's hub holds the ported
    # weights; naver's own upload (its original layout, which the PE converts) is the url fallback.
    rope = dict(
        **paper("2403.13298").cfg(origin=True),
        crop_pct=0.9,
        license="apache-2.0",
    )
    for size, name in (("s", "small"), ("b", "base"), ("l", "large")):
        for pe, timm_pe, naver_pe in (
            ("rope2d", "rope", "axial"),
            ("rope2d_mixed", "rope_mixed", "mixed"),
            ("rope2d_ape", "rope_ape", "axial_ape"),
            ("rope2d_mixed_ape", "rope_mixed_ape", "mixed_ape"),
        ):
            args = dict(init_values=1e-5, no_embed_class=True) if pe.endswith("ape") else dict(init_values=1e-5)
            naver = f"{_HUB}/naver-ai/rope_{naver_pe}_deit_{name}_patch16_LS/resolve/main/pytorch_model.bin"
            w[f"vit_{size}_{pe}"] = {
                "naver_in1k": _timm(f"vit_{name}_patch16_{timm_pe}_224", "naver_in1k", url=naver, **rope)
                | dict(model_args=args)
            }
    # iRPE (DeiT + contextual product iRPE, 50 buckets shared by the heads, APE kept): the authors' release
    irpe = dict(
        **paper("2107.14222").cfg(origin=True),
        crop_pct=0.875,
        license="apache-2.0",
    )
    for size, name, on in (
        ("t", "tiny", "k"),
        ("s", "small", "k"),
        ("b", "base", "k"),
        ("s", "small", "qkv"),
        ("b", "base", "qkv"),
    ):
        pe = "irpe" if on == "k" else "irpe_qkv"
        url = f"{_IRPE_RELEASE}/deit_{name}_patch16_224_ctx_product_50_shared_{on}.pth"
        w[f"vit_{size}_{pe}"] = {"ms_in1k": dict(url=url, **irpe)}
    # DINOv3 (LVD-1689M): timm's hub copies, a backbone without a head (features; 256 px, no crop). timm's plain
    # ports have no qkv bias (the released q/v biases are zero); the filter gives the model's q/v bias zeros.
    dinov3 = dict(
        **paper("2508.10104").cfg(origin=True),
        num_classes=0,
        input_size=(3, 256, 256),
        crop_pct=1.0,
        license="dinov3-license",
    )
    for size, name in (("s", "small"), ("b", "base"), ("l", "large")):
        w[f"vit_{size}_rope2d_dinov3"] = {"lvd1689m": _timm(f"vit_{name}_patch16_dinov3", "lvd1689m", **dinov3)}
    return w


_IRPE_RELEASE = "https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0"
_DEIT_HASH = {"tiny": "a1311bcf", "small": "cd65a155", "base": "b5f2ef4d"}
_AUGREG_TAGS = {
    "t": ("augreg_in21k_ft_in1k", "augreg_in21k"),
    "s": ("augreg_in21k_ft_in1k", "augreg_in1k", "augreg_in21k"),
    "b": ("augreg2_in21k_ft_in1k", "augreg_in21k_ft_in1k", "augreg_in1k", "augreg_in21k", "orig_in21k_ft_in1k"),
}


def _swin() -> dict[str, dict[str, dict]]:
    """Microsoft's Swin releases: timm's hub copy first, the original-layout .pth as the url fallback."""
    w: dict[str, dict[str, dict]] = {}
    files = {  # tag -> (release, file suffix)
        "ms_in1k": ("v1.0.0", ""),
        "ms_in22k_ft_in1k": ("v1.0.8", "_22kto1k_finetune"),
        "ms_in22k": ("v1.0.8", "_22k"),
    }
    for size, name in (("t", "tiny"), ("s", "small"), ("b", "base")):
        arch = f"swin_{name}_patch4_window7_224"
        w[f"swin_{size}_rpb"] = {}
        for tag, (release, suffix) in files.items():
            if size == "b":  # Swin-B's 22k files came with the first release, under other names
                release, suffix = "v1.0.0", {"ms_in22k_ft_in1k": "_22kto1k", "ms_in22k": "_22k"}.get(tag, "")
            classes = dict(num_classes=21841) if tag == "ms_in22k" else {}
            url = f"{_SWIN_RELEASE}/{release}/{arch}{suffix}.pth"
            w[f"swin_{size}_rpb"][tag] = _timm(arch, tag, url=url, **classes)
    return w


def _cvt() -> dict[str, dict[str, dict]]:
    """Microsoft's CvT on the Hugging Face hub (transformers layout). The weights were trained with QuickGELU (the
    official code); the transformers port runs them with exact GELU, so the cfg picks QuickGELU."""
    quick = dict(model_args=dict(act_layer="quick_gelu"))
    at384 = dict(input_size=(3, 384, 384), crop_pct=1.0)
    w: dict[str, dict[str, dict]] = {}
    for size, hub in (("13", "cvt-13"), ("21", "cvt-21")):
        w[f"cvt_{size}"] = {
            "ms_in1k": dict(hf_hub_id=f"microsoft/{hub}", **quick),
            "ms_in1k_384": dict(hf_hub_id=f"microsoft/{hub}-384", **at384, **quick),
            "ms_in22k_ft_in1k_384": dict(hf_hub_id=f"microsoft/{hub}-384-22k", **at384, **quick),
        }
    w["cvt_w24"] = {"ms_in22k_ft_in1k_384": dict(hf_hub_id="microsoft/cvt-w24-384-22k", **at384, **quick)}
    return w


WEIGHTS: dict[str, dict[str, dict]] = {**_vit(), **_swin(), **_cvt()}


def model_args_for(name: str, tag: str | None) -> dict:
    """The options the weights `name.tag` were trained with ({} for a name or tag without published weights)."""
    return dict(WEIGHTS.get(name, {}).get(tag or "", {}).get("model_args", {}))
