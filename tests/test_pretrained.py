"""`pretrained=True` for every published source: a random-weight checkpoint in the source's exact key layout, loaded
through timm's machinery (file overlay in place of the download), gives the source architecture's logits.

Tolerance 1e-5 on logits of O(1): fp32 sums over <= 1536 terms through 2-4 blocks differ by a few 1e-7 between two
implementations that order the reductions differently (attention backend, fused vs split qkv), far below 1e-5,
while a wrong mapping (one swapped tensor, a wrong rotation) moves logits by O(0.1)."""

import re

import pytest
import timm
import torch
from safetensors.torch import save_file

import visionpe  # noqa: F401  (registers the models)
from visionpe.pos import CheckpointMismatch
from visionpe.zoo.pretrained_cfgs import WEIGHTS

TOL = 1e-5


def _randomize(model: torch.nn.Module) -> dict:
    """Random values for every tensor (LayerScale, head, frequencies, norms) so that each one matters."""
    torch.manual_seed(0)
    sd = model.state_dict()
    for k, v in sd.items():
        if v.is_floating_point():
            sd[k] = torch.randn_like(v) * (0.5 if "gamma" in k or "freqs" in k else 0.05) + (
                1.0 if "norm" in k and k.endswith("weight") else 0.0
            )
    model.load_state_dict(sd)
    return sd


def _save(sd: dict, path, safetensors: bool = True) -> str:
    if safetensors:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save(sd, str(path))
    return str(path)


def _load(name: str, path: str, **kw):
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), **kw).eval()


def _max_diff(a, b, x) -> float:
    with torch.no_grad():
        return (a(x) - b(x)).abs().max().item()


# ------------------------------------------------------------------------------------------------------ ViT / DeiT

VIT = [
    ("deit_tiny_patch16_224", "vit_t_ape"),
    ("deit_small_patch16_224", "vit_s_ape"),
    ("deit_base_patch16_224", "vit_b_ape"),
    ("vit_small_patch16_224", "vit_s_ape.augreg_in21k_ft_in1k"),
    ("vit_base_patch16_224", "vit_b_ape.augreg2_in21k_ft_in1k"),
]
ROPE = [  # timm's ports of naver's RoPE-ViT
    (f"vit_{size}_patch16_{src}_224", f"vit_{s}_{pe}")
    for size, s in (("small", "s"),)  # ViT-B's ports take the same path (tests/test_vit_weights.py loads them)
    for src, pe in (
        ("rope", "rope2d"),
        ("rope_mixed", "rope2d_mixed"),
        ("rope_ape", "rope2d_ape"),
        ("rope_mixed_ape", "rope2d_mixed_ape"),
    )
] + [("vit_large_patch16_rope_mixed_224", "vit_l_rope2d_mixed")]
DEPTH2 = dict(depth=2)  # two blocks: every block type is exercised, the test stays fast


@pytest.mark.parametrize("source, ours", VIT + ROPE)
def test_timm_layout_loads_with_pretrained_true_and_no_extra_kwarg(source, ours, tmp_path):
    ref = timm.create_model(source, **DEPTH2).eval()
    path = _save(_randomize(ref), tmp_path / "w.safetensors")
    model = _load(ours, path, **DEPTH2)  # LayerScale / no_embed_class come from the tag's cfg
    assert _max_diff(model, ref, torch.randn(2, 3, 224, 224)) < TOL


def _naver_layout(timm_sd: dict, depth: int) -> dict:
    """naver-ai/rope-vit's names for the same weights: `freqs` [2, depth, H*d/2], `freqs_t_x/y` buffers, the
    weights under "model" (DeiT's training checkpoint)."""
    sd = {}
    for k, v in timm_sd.items():
        if k == "rope.freqs":
            sd["freqs"] = v.reshape(2, depth, -1)
        elif not k.startswith("rope."):
            sd[k] = v
    if "freqs" in sd:
        t = torch.arange(14 * 14, dtype=torch.float32)
        sd["freqs_t_x"], sd["freqs_t_y"] = t % 14, torch.div(t, 14, rounding_mode="floor")
    return {"model": sd}


@pytest.mark.parametrize("source, ours", ROPE[:4])
def test_naver_layout_loads_and_gives_the_timm_port_logits(source, ours, tmp_path):
    ref = timm.create_model(source, **DEPTH2).eval()
    path = _save(_naver_layout(_randomize(ref), 2), tmp_path / "naver.pth", safetensors=False)
    model = _load(ours, path, **DEPTH2)
    assert _max_diff(model, ref, torch.randn(2, 3, 224, 224)) < TOL


def test_default_tag_sets_the_options_the_weights_need():
    assert timm.models.get_pretrained_cfg("vit_b_rope2d_mixed").tag == "naver_in1k"
    assert WEIGHTS["vit_b_rope2d_mixed_ape"]["naver_in1k"]["model_args"] == dict(init_values=1e-5, no_embed_class=True)
    plain = timm.create_model("vit_s_rope2d_mixed_ape", depth=1)
    tagged = timm.create_model("vit_s_rope2d_mixed_ape.naver_in1k", depth=1)
    assert not any("ls1" in k for k in plain.state_dict()) and any("ls1" in k for k in tagged.state_dict())
    assert tagged.pe.encodings["ape"].num_prefix_entries == 0 and plain.pe.encodings["ape"].num_prefix_entries == 1


def test_every_tag_names_a_download_location():
    for name, tags in WEIGHTS.items():
        assert timm.is_model(name), name
        for tag in tags:
            cfg = timm.models.get_pretrained_cfg(f"{name}.{tag}")
            assert cfg.hf_hub_id or cfg.url, f"{name}.{tag}"


# ------------------------------------------------------------------------------------------------------------ Swin

SWIN_SMALL = dict(depths=(2, 2, 2, 2))  # shifted and unshifted blocks in every stage, fewer of them


def _swin_pair():
    ref = timm.create_model("swin_tiny_patch4_window7_224", **SWIN_SMALL).eval()
    return ref, _randomize(ref)


def test_swin_timm_layout(tmp_path):
    ref, sd = _swin_pair()
    model = _load("swin_t_rpb", _save(sd, tmp_path / "w.safetensors"), **SWIN_SMALL)
    assert _max_diff(model, ref, torch.randn(2, 3, 224, 224)) < TOL


def test_swin_microsoft_layout(tmp_path):
    ref, sd = _swin_pair()
    official = {}  # Swin-Transformer's names: merging at the end of a stage, `head.weight`, buffers saved
    for k, v in sd.items():
        k = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) - 1}.downsample", k)
        official[k.replace("head.fc.", "head.")] = v
    official["layers.0.blocks.1.attn_mask"] = torch.zeros(64, 49, 49)
    model = _load("swin_t_rpb", _save({"model": official}, tmp_path / "ms.pth", safetensors=False), **SWIN_SMALL)
    assert _max_diff(model, ref, torch.randn(2, 3, 224, 224)) < TOL


# ------------------------------------------------------------------------------------------------------------- CvT


@pytest.fixture(scope="module")
def hf_cvt13():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.CvtForImageClassification(transformers.CvtConfig(depth=[1, 2, 3], num_labels=1000)).eval()
    with torch.no_grad():
        for m in hf.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    return hf


class _Logits(torch.nn.Module):
    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, x):
        return self.hf(x).logits


def _with_quick_gelu(hf):
    """transformers' CvT runs the weights with exact GELU; the official models (and the weights) use QuickGELU."""
    import copy

    from timm.layers import QuickGELU

    hf = copy.deepcopy(hf)
    for m in hf.modules():
        if hasattr(m, "activation") and isinstance(m.activation, torch.nn.GELU):
            m.activation = QuickGELU()
    return hf


CVT_SMALL = dict(depths=(1, 2, 3))


def test_cvt_hugging_face_layout(hf_cvt13, tmp_path):
    path = _save(hf_cvt13.state_dict(), tmp_path / "pytorch_model.bin", safetensors=False)
    x = torch.randn(2, 3, 224, 224)
    model = _load("cvt_13", path, **CVT_SMALL)  # the tag's cfg picks QuickGELU, the trained activation
    assert _max_diff(model, _Logits(_with_quick_gelu(hf_cvt13)), x) < TOL
    as_ported = _load("cvt_13", path, act_layer="gelu", **CVT_SMALL)
    assert _max_diff(as_ported, _Logits(hf_cvt13), x) < TOL


def test_cvt_official_layout(hf_cvt13, tmp_path):
    ours = _load("cvt_13", _save(hf_cvt13.state_dict(), tmp_path / "hf.bin", safetensors=False), **CVT_SMALL)
    official = {re.sub(r"^stages\.(\d+)\.", r"stage\1.", k): v for k, v in ours.state_dict().items()}
    model = _load("cvt_13", _save(official, tmp_path / "official.pth", safetensors=False), **CVT_SMALL)
    assert _max_diff(model, _Logits(_with_quick_gelu(hf_cvt13)), torch.randn(2, 3, 224, 224)) < TOL


# -------------------------------------------------------------------------------------------- wrong architecture


@pytest.mark.parametrize(
    "source, kwargs, ours, says",
    [
        (
            "swin_tiny_patch4_window7_224",
            {},
            "vit_s_ape",
            "swin checkpoint (embed_dim=96, depths=(2, 2, 6, 2)): load it into swin_t_*",
        ),
        ("vit_base_patch16_224", DEPTH2, "vit_s_ape", "vit checkpoint (embed_dim=768, depth=2)"),
        ("deit_small_patch16_224", {}, "swin_t_rpb", "load it into vit_s_*"),
        ("deit_base_patch16_224", {}, "vit_s_ape", "load it into vit_b_*"),
    ],
)
def test_wrong_architecture_is_one_line_naming_what_it_is(source, kwargs, ours, says):
    with torch.device("meta"):
        sd = timm.create_model(source, **kwargs).state_dict()
    zeros = {k: torch.zeros(()).expand(v.shape) for k, v in sd.items()}  # shapes are all the filters read
    with pytest.raises(CheckpointMismatch) as err:
        timm.create_model(ours, pretrained=True, pretrained_cfg_overlay=dict(state_dict=zeros), **kwargs)
    msg = str(err.value)
    assert says in msg and "\n" not in msg and len(msg) < 300, msg
