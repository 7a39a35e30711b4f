"""A tubelet resized in time and space (visionpe.layers.tubelet_resize, `set_input_size(patch_size=(t, p, p))` on
the video ViT): the resized kernel on the clip resampled tubelet by tubelet gives the original tokens (t' >= t,
p' >= p), the least-squares kernel below, and a resized model is the model built at that tubelet."""

import pytest
import timm
import torch
import torch.nn.functional as F

import visionpe  # noqa: F401  (registers the models)
from visionpe.layers.tubelet_resize import resize_tubelet, time_resize_matrix
from visionpe.zoo.multimodal_family import MM
from visionpe.zoo.video_family import VIDEO

EPS = torch.finfo(torch.float32).eps


def _model(name="vivit_n_rope3d", **kw):
    torch.manual_seed(0)
    return timm.create_model(name, **{**VIDEO.tiny, **kw}).eval()


def _resample(clip: torch.Tensor, t: int, p: int, t_new: int, p_new: int) -> torch.Tensor:
    """B x tubelet by tubelet: each t x p x p tubelet of clip [B, C, T, H, W] to t_new x p_new x p_new (time:
    B_t per pixel; space: timm's bicubic antialiased resize per frame), reassembled in place."""
    b, c, T, H, W = clip.shape
    n, gh, gw = T // t, H // p, W // p
    tub = clip.reshape(b, c, n, t, gh, p, gw, p).permute(0, 2, 4, 6, 1, 3, 5, 7)  # [b, n, gh, gw, c, t, p, p]
    tub = torch.einsum("st,...tyx->...syx", time_resize_matrix(t, t_new).float(), tub)
    flat = tub.reshape(-1, 1, p, p)
    flat = F.interpolate(flat, size=(p_new, p_new), mode="bicubic", antialias=True, align_corners=False)
    tub = flat.reshape(b, n, gh, gw, c, t_new, p_new, p_new).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return tub.reshape(b, c, n * t_new, gh * p_new, gw * p_new)


def _tokens(embed, clip):
    return embed(clip)[0]


@pytest.mark.parametrize("t_new, p_new", [(4, 8), (3, 4), (2, 12)])
def test_resized_tokens_of_the_resampled_clip_are_the_original_tokens(t_new, p_new):
    model = _model(patch_size=4)
    embed = model.patch_embed
    torch.manual_seed(1)
    clip = torch.randn(1, 3, 4, 8, 8)  # 2 x 2 x 2 tubelets of 2 x 4 x 4
    with torch.no_grad():
        ref, w = _tokens(embed, clip), embed.proj.weight.detach().clone()
    model.set_input_size(patch_size=(t_new, p_new, p_new))
    up = _resample(clip, 2, 4, t_new, p_new)
    with torch.no_grad():
        out = _tokens(embed, up)
    assert embed.tubelet_size == t_new and embed.proj.weight.shape[2:] == (t_new, p_new, p_new)
    # float32 dot products of K terms err by <= K eps sum |x_i w_i| on each side (w' rounded from float64, B x from
    # a few-term float32 sum: within the same bound); a kernel off by any frame or pixel errs by ~ the tokens
    k = embed.proj.weight[0].numel()
    flat = clip.reshape(1, 3, 2, 2, 2, 4, 2, 4).permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(8, -1)
    flat_up = up.reshape(1, 3, 2, t_new, 2, p_new, 2, p_new).permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(8, -1)
    bound = flat.abs() @ w.flatten(1).abs().T + flat_up.abs() @ embed.proj.weight.detach().flatten(1).abs().T
    assert ((out - ref)[0].abs() <= k * EPS * bound).all()
    assert (out - ref).abs().max() < 1e-2 * ref.abs().max()  # (the bound is far below the tokens' scale)


def test_a_shorter_tubelet_is_the_least_squares_kernel_and_keeps_static_clips():
    torch.manual_seed(0)
    w = torch.randn(5, 3, 4, 4, 4, dtype=torch.float64)
    v = resize_tubelet(w, (2, 4, 4))
    bt = time_resize_matrix(4, 2)  # [2, 4]: 4 frames -> 2
    residual = torch.einsum("st,oisyx->oityx", bt, v) - w  # B_t^T w' - w, per pixel
    # the normal equations: the residual is orthogonal to the range of B_t^T (float64: ~ eps64 of the scale)
    assert (
        torch.einsum("st,oityx->oisyx", bt, residual).abs().max() <= 64 * torch.finfo(torch.float64).eps * w.abs().max()
    )
    assert residual.abs().max() > 0.1  # (4 frames do not fit into 2: the residual is not zero)
    # 2 frames -> 1: B_t averages them, so w' sums the frames and a static clip gives the same tokens
    model = _model()
    clip = torch.randn(1, 3, 1, 32, 32).expand(-1, -1, 4, -1, -1)
    with torch.no_grad():
        ref = _tokens(model.patch_embed, clip)  # 2 time steps
    model.set_input_size(patch_size=(1, 8, 8))
    with torch.no_grad():
        out = _tokens(model.patch_embed, clip).view(1, 4, 16, -1)  # 4 time steps
    bound = 8 * 3 * 2 * 64 * EPS * ref.abs().max()
    assert (out[:, ::2] - ref.view(1, 2, 16, -1)).abs().max() <= bound and torch.equal(out[:, 0], out[:, 1])


def test_the_resized_model_is_the_model_built_at_that_tubelet():
    model = _model("vivit_n_rope3d")
    model.set_input_size(patch_size=(4, 8, 8))
    built = _model("vivit_n_rope3d", tubelet_size=4)
    built.load_state_dict(model.state_dict())  # strict: the kernel's shape
    assert model.patch_embed.grid_size == built.patch_embed.grid_size == (1, 4, 4)
    x = torch.randn(1, 3, 8, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), built(x))
    assert model(x).shape == (1, 400)
    mm = timm.create_model("mm_n_mrope", **MM.tiny)  # the multimodal stem is the same TubeletEmbed
    mm.set_input_size(patch_size=(1, 8, 8))
    assert (
        mm.patch_embed.tubelet_size == 1 and mm(torch.randn(1, 3, 32, 32), text_ids=torch.ones(1, 3).long()).ndim == 2
    )


@pytest.mark.parametrize(
    "bad, match", [((0, 8, 8), "tubelet's length"), ((2, 4, 8), "positive integer"), ((2.0, 8, 8), "tubelet's length")]
)
def test_a_bad_tubelet_is_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        _model().set_input_size(patch_size=bad)


@pytest.mark.parametrize("name", ["vivit_n_rope3d", "vivit_n_ape"])
def test_a_clip_resampled_tubelet_by_tubelet_gives_the_same_logits(name):
    """FlexiViT's invariance in 3D: tubelets 2 x 8 x 8 -> 4 x 16 x 16 and the clip resampled to match keep the token
    grid (2 x 4 x 4), so the PEs see the same positions and the logits agree (tokens within float32 rounding, through
    two blocks: 64 eps of the logits' scale)."""
    model = _model(name)
    clip = torch.randn(1, 3, 4, 32, 32)
    with torch.no_grad():
        ref = model(clip)
        model.set_input_size(img_size=64, num_frames=8, patch_size=(4, 16, 16))
        out = model(_resample(clip, 2, 8, 4, 16))
    assert model.patch_embed.grid_size == (2, 4, 4)
    assert (out - ref).abs().max() <= 64 * EPS * (1 + ref.abs().max())
