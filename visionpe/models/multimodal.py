"""A single-stream multimodal encoder: text, then a visual input (image or video), then text, in one sequence.

    [text_ids[:k]] <img> [visual tokens, T x H x W raster] </img> [text_ids[k:]]

The markers <img> / </img> are learned text tokens (they are what V2PE's marker rule positions). RoPE positions come
from `visionpe.pos.mm_positions` under the model's scheme (rope1d, mrope, videorope, vrope or v2pe) for the segments
text(k + 1), video(T, H, W), text(L - k + 1); an image is a video with one tubelet frame. The model returns token
features (`forward_features`), a pooled output (`forward_head(pre_logits=True)`) and class logits (`forward`).

Test-time RoPE scaling (`position_mode='ntk' | 'yarn'`, visionpe.pos.rope_nd): each position stream scales by the
spread of the input sequence's positions over that of the training sequence, the reference clip (img_size x
num_frames) between its markers with `text_length` text ids, built under the model's scheme. RIFLEx
(`position_mode='riflex'`) compares the time stream's spreads the same way.
"""

from __future__ import annotations

import operator
from dataclasses import replace

import torch
from torch import nn

from ..layout.batch import is_native_batch
from ..layout.tokens import TokenLayout
from ..pos.base import PEHost
from ..position_modes import EXTRAPOLATE, VIDEO_MODES
from .construction import factory_kwargs
from .native_sequence import embed_native_sequence
from .video_vit import TubeletEncoder

__all__ = ["MultimodalEncoder", "check_text"]


def check_text(text_ids: torch.Tensor | None, vocab_size: int, batch: int, device) -> torch.Tensor:
    """Validate token ids [B, L] (None: no text); returns them as long [B, L]."""
    if text_ids is None:
        return torch.zeros(batch, 0, dtype=torch.long, device=device)
    if not isinstance(text_ids, torch.Tensor):
        raise TypeError(f"text_ids must be a tensor of token ids [B, L], got {type(text_ids).__name__}")
    if text_ids.dtype.is_floating_point or text_ids.dtype.is_complex or text_ids.dtype == torch.bool:
        raise TypeError(f"text_ids must hold integer token ids, got dtype {text_ids.dtype}; use text_ids.long()")
    if text_ids.ndim != 2:
        hint = " (add a batch dimension with text_ids.unsqueeze(0))" if text_ids.ndim == 1 else ""
        raise ValueError(f"text_ids must be [B, L], got shape {tuple(text_ids.shape)}{hint}")
    if text_ids.shape[0] != batch:
        raise ValueError(f"text_ids has batch {text_ids.shape[0]} but the visual input has batch {batch}")
    eager = not torch.compiler.is_compiling() and text_ids.device.type != "meta"
    if text_ids.numel() and eager:  # a value check: eager, on real tensors only (no host sync)
        lo, hi = int(text_ids.min()), int(text_ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"text id {bad} is out of range for a vocabulary of {vocab_size} ids [0, {vocab_size}); remap the "
                f"ids or build the model with vocab_size={hi + 1}"
            )
    return text_ids.long().to(device)


def _check_count(value, what: str) -> int:
    """A count of text ids as an int >= 0 (`what` names it in the error)."""
    if not isinstance(value, bool) and hasattr(value, "__index__") and operator.index(value) >= 0:
        return operator.index(value)
    raise ValueError(f"{what} must be an integer >= 0, got {value!r}")


def _refreshing_count(name: str, what: str) -> property:
    """A count of text ids (an int >= 0) that, set after construction, refreshes the PEs' training sequence."""

    def put(self, value) -> None:
        self.__dict__[f"_{name}"] = _check_count(value, what)
        self._refresh_host()

    return property(lambda self: self.__dict__[f"_{name}"], put, doc=what)


class MultimodalEncoder(TubeletEncoder):
    position_modes = VIDEO_MODES  # extrapolate; ntk / yarn / riflex act on RoPE-ND (visionpe.pos.rope_nd)

    @factory_kwargs
    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        num_frames: int = 2,
        patch_size: int = 16,
        tubelet_size: int = 2,
        in_chans: int = 3,
        vocab_size: int = 512,
        text_split: int = 1,
        global_pool: str = "avg",
        class_token: bool = False,
        embed_dim: int = 768,
        pe: str = "mrope",
        text_length: int = 0,
        position_mode: str = EXTRAPOLATE,
        **kwargs,
    ):
        """pe: the RoPE scheme preset (rope1d, mrope, videorope, vrope, v2pe); text_split: how many leading text ids
        go before the visual input (the rest follow it); the scheme's options (RoPE base `theta`, V2PE's visual step
        `delta`) go in pe_kwargs. text_length: text ids per sample in training (0: none), with img_size x num_frames
        the training sequence that position_mode 'ntk' / 'yarn' compare the input's positions with; position_mode:
        'extrapolate' (raw positions), 'ntk' / 'yarn' (RoPE-ND schemes rescale their frequencies beyond the
        training sequence) or 'riflex' (schemes with a time stream lower its intrinsic frequency, RIFLEx); other
        PEs read them as 'extrapolate'. Other kwargs (num_classes, depth, num_heads,
        pe_kwargs, ...): see TokenEncoder."""
        self.text_split = text_split  # before the trunk: its PE host reads both
        self.text_length = text_length
        stem = (img_size, num_frames, patch_size, tubelet_size, in_chans, embed_dim)
        trunk = dict(global_pool=global_pool, class_token=class_token, pe=pe, default_scheme="rope1d")
        trunk.update(position_mode=position_mode)
        super().__init__(*stem, **trunk, **kwargs)
        self.vocab_size = vocab_size
        self.text_embed = nn.Embedding(vocab_size, embed_dim)
        self.markers = nn.Parameter(torch.zeros(2, embed_dim))  # <img>, </img>
        self._init_layers()

    def _init_layers(self) -> None:
        super()._init_layers()
        nn.init.normal_(self.text_embed.weight, std=0.02)
        nn.init.normal_(self.markers, std=0.02)

    # ---------------------------------------------------------------------------------------------------- sequence

    def visual_tokens(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """Images [B, C, H, W] (repeated to one tubelet) or clips [B, C, T, H, W] -> [B, Nv, D] and (T', H', W')."""
        if isinstance(pixels, torch.Tensor) and pixels.ndim == 4:
            pixels = pixels.unsqueeze(2).expand(-1, -1, self.patch_embed.tubelet_size, -1, -1)
        return self.patch_embed(pixels)

    def segments(self, num_text: int, grid: tuple[int, int, int], text_split: int) -> list[tuple]:
        """The segment spec of the sequence: text(k + 1) incl. <img>, the visual grid, text(L - k + 1) incl. </img>."""
        return [("text", text_split + 1), ("video", tuple(grid)), ("text", num_text - text_split + 1)]

    def embed(
        self, pixels: torch.Tensor, text_ids: torch.Tensor | None = None, text_split: int | None = None
    ) -> tuple[torch.Tensor, TokenLayout]:
        """-> tokens [B, P + N, D] (before the token-site PEs) and their interleaved layout (grid None)."""
        x, layout, _ = self.embed_sequence(pixels, text_ids, text_split)
        return x, layout

    def embed_sequence(
        self, pixels: torch.Tensor, text_ids: torch.Tensor | None = None, text_split: int | None = None
    ) -> tuple[torch.Tensor, TokenLayout, tuple[int, tuple[int, int, int]]]:
        """`embed`, plus where the visual tokens sit: (offset among the non-prefix tokens, (T', H', W'))."""
        vis, grid = self.visual_tokens(pixels)
        B, _, D = vis.shape
        ids = check_text(text_ids, self.vocab_size, B, vis.device)
        k = self.text_split if text_split is None else text_split
        k = min(k, ids.shape[1]) if text_split is None else k
        if not 0 <= k <= ids.shape[1]:
            raise ValueError(f"text_split={k} is outside [0, {ids.shape[1]}] for {ids.shape[1]} text ids")
        text = self.text_embed(ids)  # [B, L, D]
        opening, closing = (m.view(1, 1, D).expand(B, 1, D) for m in self.markers)
        x = torch.cat([text[:, :k], opening, vis, closing, text[:, k:]], dim=1)
        layout = self.scheme_layout(self.segments(ids.shape[1], grid, k), x.device)
        return self.add_prefix(x), layout, (k + 1, tuple(grid))

    def checked_text(self, text_ids: torch.Tensor | None, batch: int, device) -> torch.Tensor:
        """text_ids validated against this model's vocabulary (`check_text`): long [B, L]."""
        return check_text(text_ids, self.vocab_size, batch, device)

    # ----------------------------------------------------------------------------------------------------- forward

    def forward_features(
        self, pixels: torch.Tensor, text_ids: torch.Tensor | None = None, text_split: int | None = None
    ) -> torch.Tensor | dict:
        """Token features [B, P + N, D] of the whole sequence (prefix, text, <img>, visual, </img>, text). A native
        batch of clips (visionpe.layout, padded or packed; an image is a clip of one tubelet; text_ids one row per
        clip, native_sequence.py) -> a dict of every row's tokens, for forward_head."""
        if is_native_batch(pixels):
            return self.native_features(*embed_native_sequence(self, pixels, text_ids, text_split))
        x, layout = self.embed(pixels, text_ids, text_split)
        return self.run_blocks(x, layout)

    def encode(
        self, pixels: torch.Tensor, text_ids: torch.Tensor | None = None, text_split: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(token features [B, P + N, D], pooled output [B, D])."""
        tokens = self.forward_features(pixels, text_ids, text_split)
        return tokens, self.forward_head(tokens, pre_logits=True)

    def forward(
        self, pixels: torch.Tensor, text_ids: torch.Tensor | None = None, text_split: int | None = None
    ) -> torch.Tensor:
        """Class logits [B, num_classes] for visual input + text ids [B, L] (ids in [0, vocab_size))."""
        return self.forward_head(self.forward_features(pixels, text_ids, text_split))

    def forward_intermediates(
        self,
        pixels: torch.Tensor,
        text_ids: torch.Tensor | None = None,
        text_split: int | None = None,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str | None = None,
        intermediates_only: bool = False,
        output_dict: bool = False,
    ):
        """Features of the chosen blocks (timm's API): the visual tokens as NCTHW maps (NCHW for an image or a
        one-tubelet clip), or every non-prefix token of the sequence (text included) as NLC; output_dict: timm's
        dict form."""
        output_fmt = self.intermediate_format(output_fmt)
        if is_native_batch(pixels):
            (x, layout), visual = embed_native_sequence(self, pixels, text_ids, text_split), None
        else:
            x, layout, visual = self.embed_sequence(pixels, text_ids, text_split)
        return self.intermediates(
            x, layout, indices, return_prefix_tokens, norm, stop_early, output_fmt, intermediates_only, visual,
            output_dict,
        )  # fmt: skip

    text_split = _refreshing_count("text_split", "text_split (text ids before the visual input)")
    text_length = _refreshing_count("text_length", "text_length (text ids per sample in training)")

    def _refresh_host(self) -> None:
        """The PEs' training sequence follows text_split / text_length set after construction (ntk / yarn read it)."""
        if "pe" in self.__dict__.get("_modules", {}) and "_text_length" in self.__dict__:
            self.set_pe_host(self._host())

    def _host(self, depth: int | None = None) -> PEHost:
        """The trunk's host plus the training sequence (`reference_segments`): the reference clip between its
        markers, with `text_length` text ids split as `text_split` splits them."""
        host = super()._host(depth)
        k = min(self.text_split, self.text_length)
        segments = self.segments(self.text_length, (host.frames, *host.grid), k)
        return replace(host, reference_segments=tuple(segments))

    def set_input_size(
        self,
        img_size=None,
        num_frames: int | None = None,
        text_length: int | None = None,
        patch_size: int | None = None,
    ) -> None:
        """Change the reference visual size (the grid the PEs are built for), text length (ntk / yarn's training
        sequence) and the visual stem's spatial patch size (its tubelet kernel PI-resized, FlexiViT)."""
        if text_length is not None:
            self.text_length = text_length
        self.set_stem_size(img_size, num_frames, patch_size)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"markers"}
