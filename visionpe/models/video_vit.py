"""Video ViT (ViViT's joint space-time model): tubelet embedding (t x p x p) and joint attention over all T x H x W
tokens, with a swappable PE: separable space-time APE, 3D RoPE, M-RoPE, VideoRoPE, VRoPE or V2PE.

Clips are [B, C, T, H, W]. Any length and size works at call time: T, H, W that are not multiples of the tubelet are
zero-padded at the end; RoPE schemes extrapolate their integer positions (or, with position_mode 'ntk' / 'yarn',
rescale their frequencies by how far each stream reaches beyond the training clip; 'riflex' lowers the intrinsic
time frequency of a clip longer than trained on), the APE resamples its tables.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..fx import fx_unsupported, is_fx_tracing
from ..layers.checks import check_tensor
from ..layers.tubelet_resize import check_tubelet, resized_tubelet_conv
from ..layout.tokens import TokenLayout
from ..position_modes import EXTRAPOLATE, VIDEO_MODES
from .construction import factory_kwargs
from .native_batch import embed_tubelets
from .token_encoder import TokenEncoder

__all__ = ["TubeletEmbed", "TubeletEncoder", "VideoViT", "check_clip"]

VISUAL_FORMATS = ("NCTHW", "NCHW", "NLC")  # maps over (T, H, W), maps over (H, W) when T = 1, tokens


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def check_clip(x: torch.Tensor, in_chans: int, tubelet: int, patch: int) -> tuple[int, int, int]:
    """Validate a clip batch [B, C, T, H, W]; returns (T, H, W)."""
    check_tensor(x, "clips", "B, C, T, H, W", {4: "images [B, C, H, W]: add a time axis with x.unsqueeze(2)"})
    if x.shape[1] != in_chans:
        raise ValueError(
            f"expected {in_chans} channels in dim 1 of [B, C, T, H, W], got shape {tuple(x.shape)}; "
            "put channels before time (x.permute(0, 2, 1, 3, 4) for [B, T, C, H, W]) or set in_chans"
        )
    t, h, w = x.shape[2:]
    if t < tubelet:
        raise ValueError(
            f"the clip has {t} frames, fewer than one tubelet ({tubelet} frames); sample at least {tubelet} frames, "
            f"repeat frames, or build the model with tubelet_size={t}"
        )
    if h < patch or w < patch:
        raise ValueError(f"frames of {h} x {w} are smaller than one patch ({patch} px); resize them to at least that")
    return t, h, w


class TubeletEmbed(nn.Module):
    """Non-overlapping t x p x p tubelets -> tokens (a Conv3d's weights, `proj`); pads T, H, W up to whole tubelets."""

    def __init__(self, img_size, num_frames: int, patch_size: int, tubelet_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.img_size = _pair(img_size)
        self.num_frames = num_frames
        self.patch_size = (patch_size, patch_size)
        self.tubelet_size = tubelet_size
        self.in_chans = in_chans
        kernel = (tubelet_size, patch_size, patch_size)
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=kernel, stride=kernel)

    def token_grid(self, t: int, h: int, w: int) -> tuple[int, int, int]:
        p, k = self.patch_size[0], self.tubelet_size
        return -(-t // k), -(-h // p), -(-w // p)

    def set_input_size(self, img_size=None, num_frames: int | None = None, patch_size=None) -> None:
        """A new reference clip size (the grid the PEs are built for); patch_size: a new spatial patch p (the
        tubelet's length stays) or a whole tubelet (t, p, p), the kernel PI-resized in space and time (FlexiViT's
        resize in 3D, visionpe.layers.tubelet_resize)."""
        if img_size is not None:
            self.img_size = _pair(img_size)
        if num_frames is not None:
            self.num_frames = int(num_frames)
        if patch_size is not None:
            t, p = check_tubelet(patch_size, self.tubelet_size)
            self.proj = resized_tubelet_conv(self.proj, (t, p, p))
            self.patch_size, self.tubelet_size = (p, p), t

    @property
    def grid_size(self) -> tuple[int, int, int]:
        """(T, H, W) token grid of the reference clip."""
        return self.token_grid(self.num_frames, *self.img_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """[B, C, T, H, W] -> tokens [B, T'*H'*W', D] (raster order, x fastest) and the grid (T', H', W')."""
        if is_fx_tracing():
            fx_unsupported("the video / multimodal encoders (their token grid and sequence follow the clip)")
        t, h, w = check_clip(x, self.in_chans, self.tubelet_size, self.patch_size[0])
        grid = self.token_grid(t, h, w)
        pt, ph, pw = grid[0] * self.tubelet_size - t, grid[1] * self.patch_size[0] - h, grid[2] * self.patch_size[0] - w
        if torch.compiler.is_compiling() or pt or ph or pw:  # traced: pad by a possibly zero amount, no size guard
            x = F.pad(x, (0, pw, 0, ph, 0, pt))
        # the Conv3d as one matmul over flattened tubelets (exact for stride = kernel; CPU conv3d is far slower)
        B, C = x.shape[:2]
        (T, H, W), k, p = grid, self.tubelet_size, self.patch_size[0]
        x = x.reshape(B, C, T, k, H, p, W, p).permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(B, T * H * W, C * k * p * p)
        return F.linear(x, self.proj.weight.flatten(1), self.proj.bias), grid  # [B, T'*H'*W', D]


class TubeletEncoder(TokenEncoder):
    """The token-encoder trunk behind a tubelet stem (the video ViT and the multimodal encoder): the stem is built
    before the trunk, so that parameters draw from the RNG in the stem -> PE -> blocks order."""

    intermediate_formats = VISUAL_FORMATS

    def __init__(self, img_size, num_frames, patch_size, tubelet_size, in_chans, embed_dim, **trunk):
        stem = TubeletEmbed(img_size, num_frames, patch_size, tubelet_size, in_chans, embed_dim)
        super().__init__(grid=stem.grid_size[1:], frames=stem.grid_size[0], embed_dim=embed_dim, **trunk)
        self.patch_embed = stem
        self.in_chans = in_chans
        self.feature_info = self.block_features(patch_size)

    def set_stem_size(self, img_size=None, num_frames: int | None = None, patch_size: int | None = None) -> None:
        """The stem's new reference clip size and spatial patch size; the PEs follow the new token grid."""
        self.patch_embed.set_input_size(img_size, num_frames, patch_size)
        self.set_reference(self.patch_embed.grid_size[1:], self.patch_embed.grid_size[0])
        if patch_size is not None:
            self.feature_info = self.block_features(self.patch_embed.patch_size[0])
        if hasattr(self, "pretrained_cfg"):
            self.pretrained_cfg = {**self.pretrained_cfg, "input_size": (self.in_chans, *self.patch_embed.img_size)}


class VideoViT(TubeletEncoder):
    position_modes = VIDEO_MODES  # ntk / yarn / riflex: visionpe.pos.rope_nd

    @factory_kwargs
    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        num_frames: int = 16,
        patch_size: int = 16,
        tubelet_size: int = 2,
        in_chans: int = 3,
        num_classes: int = 400,
        embed_dim: int = 768,
        pe: str = "rope3d",
        position_mode: str = EXTRAPOLATE,
        **kwargs,
    ):
        """pe: a PE preset (visionpe.pos.PE_PRESETS), e.g. 'ape_st', 'rope3d', 'vrope'; its options (e.g. V2PE's
        visual step `delta`) go in pe_kwargs. position_mode: 'extrapolate' (raw positions), 'ntk' / 'yarn'
        (RoPE-ND schemes rescale their frequencies beyond the training clip) or 'riflex' (RoPE-ND schemes with a
        time stream lower its intrinsic frequency, RIFLEx); other PEs read them as 'extrapolate'.
        Other kwargs (depth, num_heads, global_pool, pe_kwargs, ...): see TokenEncoder."""
        stem = (img_size, num_frames, patch_size, tubelet_size, in_chans, embed_dim)
        trunk = dict(num_classes=num_classes, pe=pe, default_scheme="rope3d", position_mode=position_mode)
        super().__init__(*stem, **trunk, **kwargs)
        self.num_frames = num_frames
        self._init_layers()

    def layout(self, grid: tuple[int, int, int], device=None) -> TokenLayout:
        """Layout of a T x H x W token grid under the model's position scheme ((t, y, x) for rope3d and the APE)."""
        return self.scheme_layout([("video", tuple(grid))], device)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, TokenLayout]:
        """Clips [B, C, T, H, W] -> tokens [B, P + N, D] (before the token-site PEs) and their layout."""
        x, grid = self.patch_embed(x)
        return self.add_prefix(x), self.layout(grid, x.device)

    def embed_native(self, x: dict):
        """A native batch of clips of different lengths and sizes (visionpe.layout: tubelets with (t, y, x)
        coordinates) -> tokens [B, L, D] and their BatchLayout."""
        return embed_tubelets(self, x)

    def set_input_size(self, img_size=None, num_frames: int | None = None, patch_size: int | None = None) -> None:
        """Change the reference clip size (and patch size p or tubelet (t, p, p), the tubelet kernel PI-resized):
        the APE's spatial table is resampled to the new grid (its temporal table is resampled at call time)."""
        self.set_stem_size(img_size, num_frames, patch_size)
        self.num_frames = self.patch_embed.num_frames
