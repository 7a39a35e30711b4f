"""SeqPE (Li et al., arXiv 2506.13277): every patch's (row, col) written as decimal digits and read by a small causal
transformer (visionpe.pos.seqpe_encoder); the result modulates the queries and keys of every layer elementwise.

Per forward the PE of every cell of the layout's grid is computed once (the token site: before the blocks), the
prefix tokens (CLS, registers) get one learned `cls_pos`. Layer i holds its own Linear `pe_qk` (`layer(i)`,
`blocks.{i}.attn.pos.seqpe.proj`) mapping a token's PE p to (pe_q, pe_k), one d-vector per head each, and its
attention uses q * pe_q and k * pe_k (elementwise, before the usual softmax(q k^T / sqrt(d))): the released script's
`attn_mul` mode, given to attention as the qk site's (q, k) -> (q, k) map.

Sizes: the encoder's width is the model's width and its heads the model's (head dim 64 for DeiT-S / -B; the paper's
runs use width 384 with 6 heads for both S and B); `width` / `heads` override it. Output width: the model's.

Other resolutions: 'extrapolate' (the official `extend`) encodes the digits of the layout's own positions, so a cell
has the same PE at every grid size; positions must lie in 0 .. max_position - 1 per axis (default 100: 2 digits; more
where the transfer objective's blocks need it).
'interpolate' computes the reference grid's PEs and resizes them bicubically to the input grid (the official
`interpolate`). In eval without autograd the table of a layout is kept, keyed by the layout's positions and the
versions of the encoder's parameters (an optimizer step or load_state_dict recomputes it).

Swin and CvT (layers with grids of their own: windows, stages; visionpe.pos.seqpe_grids): a layer reads its own
grid's positions against its own grid as reference, its table computed by the layer in training (not shared, so that
gradient checkpointing recomputes it inside the block); CvT's strided keys read the query grid's PEs bilinearly.

Training objectives (visionpe.pos.seqpe_losses, the paper's weights 0.1 each): computed in every training forward
with autograd at the token site and returned once by `aux_loss()`, which the trainer adds to the task loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from ..layout.tokens import TokenLayout, image_layout
from ..position_modes import INTERPOLATE
from .base import PEHost, PosContext, PosEncoding
from .seqpe_encoder import DigitEncoder, digit_tokens, digits_for
from .seqpe_grids import default_max_position, layer_grid, own_grids, sample_cells, transfer_grid
from .seqpe_losses import contrastive_loss, nearest_labels, sample_contrastive, sample_transfer, transfer_loss
from .table_cache import TableCache

__all__ = ["SeqPE", "attn_mul"]

# the objectives' draws per step (the official per-GPU sizes): pivots x candidates, blocks x cells
PIVOTS, CANDIDATES, LOCAL_RATE, BLOCKS, CELLS = 32, 64, 0.2, 32, 64


def attn_mul(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """x [B, H, N, d] times the per-token, per-head PE pe [H, N, d] (elementwise; math in x's dtype)."""
    return x * pe.to(x.dtype)


class QKProjection(nn.Module):
    """One layer's `pe_qk`: a token's PE [.., width] -> (pe_q, pe_k), each [H, N, d]."""

    def __init__(self, width: int, heads: int, head_dim: int):
        super().__init__()
        self.heads = heads
        self.proj = nn.Linear(width, 2 * heads * head_dim)

    def forward(self, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pe = self.proj(table).unflatten(-1, (2, self.heads, -1)).permute(1, 2, 0, 3)  # [2, H, N, d]
        return pe[0], pe[1]


class SeqPE(PosEncoding):
    """SeqPE at the qk site (attn_mul). max_position: positions per axis the digits can write (default 100: 0..99, 2
    digits; a power of ten >= twice the transfer grid's side where 100 is less); width / heads: the encoder's
    (default: the model's); depth: its blocks (2); dropout: on its residual branches in training (0.1, the paper's
    ViT-S run); contrastive_weight / transfer_weight: the weights of the training objectives
    (visionpe.pos.seqpe_losses; 0.1 each, the paper's), drawn and computed in every training forward with autograd
    and handed to the trainer by `aux_loss()`; 0 turns one off."""

    positive_options = ("max_position", "width", "heads", "depth")

    def __init__(
        self,
        host: PEHost,
        max_position: int | None = None,
        width: int | None = None,
        heads: int | None = None,
        depth: int = 2,
        dropout: float = 0.1,
        contrastive_weight: float = 0.1,
        transfer_weight: float = 0.1,
    ):
        super().__init__(host)
        max_position = default_max_position(transfer_grid(host)) if max_position is None else max_position
        if int(max_position) < 2:
            raise ValueError(f"SeqPE max_position must be at least 2 (positions per axis), got {max_position}")
        self.max_position, self.digits = int(max_position), digits_for(max_position)
        width = host.dim if width is None else int(width)
        heads = (host.layers[0].num_heads if width == host.dim else max(1, width // 64)) if heads is None else heads
        self.encoder = DigitEncoder(2, self.digits, width, int(heads), int(depth), host.dim, float(dropout))
        # the official `cls_token_pos_embed`, where prefix tokens attend in every layer (ViT); on Swin (no prefix)
        # and CvT (a CLS in the last stage alone, pruned with it) prefix tokens read a zero PE: their pe_q, pe_k are
        # each layer's projection bias
        self.cls_pos = nn.Parameter(torch.zeros(host.dim)) if host.num_prefix and not own_grids(host) else None
        self._cache = TableCache(size=8, learned=True)
        self._fresh: list = []  # [(positions, prefix, table)] of this forward's grids (training; one per image group)
        self.contrastive_weight, self.transfer_weight = float(contrastive_weight), float(transfer_weight)
        self._aux: torch.Tensor | None = None  # the objectives of the last training forward, until aux_loss()
        if self.transfer_weight:  # its shifted blocks must fit: the error now, not at the first training step
            sample_transfer(1, 1, transfer_grid(host), self.max_position)

    def __getstate__(self):
        """Copies and pickles leave this forward's tables and objectives behind (tensors of an autograd graph)."""
        return {**super().__getstate__(), "_fresh": [], "_aux": None}

    def layer(self, i):
        spec = self.host.layers[i]
        return QKProjection(self.host.dim, spec.num_heads, spec.head_dim)

    def reset_parameters(self) -> None:
        if self.cls_pos is not None:
            nn.init.zeros_(self.cls_pos)

    def init_weights(self) -> None:
        self.encoder.init()
        if self.cls_pos is not None:
            trunc_normal_(self.cls_pos, std=0.02)

    def init_non_persistent_buffers(self) -> None:
        self.encoder.init_non_persistent_buffers()
        self._fresh = []

    def no_weight_decay(self) -> set[str]:
        own = {"cls_pos"} if self.cls_pos is not None else set()
        return own | {"encoder.place_embed", "encoder.axis_embed", "encoder.cls_embed"}

    # ------------------------------------------------------------------------------------------------- positions

    def _coords(self, layout: TokenLayout) -> torch.Tensor:
        """The layout's integer (row, col) [N, 2]; one clear error where the digits cannot write them."""
        if layout.streams != 2:
            raise ValueError(f"SeqPE reads (x, y) image positions, the layout has {layout.streams} streams")
        pos = layout.pos.flip(-1)
        if not torch.compiler.is_compiling() and pos.numel() and pos.device.type != "meta":
            top = int(pos.max()) + 1
            if top > self.max_position:
                raise ValueError(
                    f"SeqPE writes positions 0..{self.max_position - 1} per axis (max_position={self.max_position}), "
                    f"this input reaches position {top - 1}; raise max_position (pe_kwargs=dict(max_position=...))"
                )
            if bool((pos < 0).any()) or not torch.equal(pos, pos.round()):
                raise ValueError("SeqPE encodes whole non-negative patch indices; use position_mode 'extrapolate'")
        return pos.round()

    def cell_table(self, layout: TokenLayout, ref: tuple[int, int] | None = None) -> torch.Tensor:
        """PEs [N, width] of the layout's positioned tokens (the encoder, or the reference grid's resized; ref:
        the reading layer's grid, default the model's)."""
        ref = tuple(self.host.grid) if ref is None else tuple(ref)
        grid = layout.grid[1:] if layout.grid is not None else None
        if self.position_mode == INTERPOLATE and grid is not None and tuple(grid) != ref:
            base = self.encoder(digit_tokens(self._coords(image_layout(*ref, 0, layout.pos.device)), self.digits))
            img = base.float().t().reshape(1, -1, *ref)
            out = F.interpolate(img, size=tuple(grid), mode="bicubic", align_corners=False)
            return out.reshape(base.shape[1], -1).t().to(base.dtype)
        return self.encoder(digit_tokens(self._coords(layout), self.digits))

    def table(self, layout: TokenLayout, ref: tuple[int, int] | None = None) -> torch.Tensor:
        """PEs [P + N, width] of every token of the layout: `cls_pos` for the prefix, then the cells'."""
        cells = self.cell_table(layout, ref)
        if not layout.num_prefix:
            return cells
        prefix = cells.new_zeros(1, cells.shape[1]) if self.cls_pos is None else self.cls_pos.to(cells.dtype)[None]
        return torch.cat([prefix.expand(layout.num_prefix, -1), cells])

    def _table(self, layout: TokenLayout, ref: tuple[int, int] | None = None) -> torch.Tensor:
        """This forward's table of `layout` (ref: the reading layer's own grid, None for the model's): kept in eval
        without autograd, else computed once per forward (at the token site) and shared by every layer; a layer with
        a grid of its own computes its table itself."""
        if not self.training and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            key = (layout.num_prefix, layout.grid, self.position_mode, ref)
            sources = (*self.parameters(), *self.buffers())
            return self._cache.lookup(key, lambda: self.table(layout, ref), (layout.pos,), sources)
        if ref is None:
            for pos, prefix, table in self._fresh:
                if pos is layout.pos and prefix == layout.num_prefix:
                    return table
        return self.table(layout, ref)

    def tokens(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """Nothing is added to the tokens: the grid's PEs are computed here, once for every layer of this forward
        (and, in training with autograd, the objectives)."""
        if own_grids(self.host):  # Swin, CvT: every layer reads its own grid's table (context)
            self._fresh = []
        elif self.training or torch.is_grad_enabled() or torch.compiler.is_compiling():
            kept = [f for f in self._fresh if not (f[0] is layout.pos and f[1] == layout.num_prefix)]
            self._fresh = [*kept, (layout.pos, layout.num_prefix, self.table(layout))][-8:]
        else:
            self._fresh = []
            self._table(layout)
        if self.training and torch.is_grad_enabled() and (self.contrastive_weight or self.transfer_weight):
            self._aux = self.objectives(layout.pos.device)
        return x

    def encode(self, coords: torch.Tensor) -> torch.Tensor:
        """PEs [..., width] of integer (row, col) coordinates [..., 2]."""
        return self.encoder(digit_tokens(coords.reshape(-1, 2), self.digits)).unflatten(0, coords.shape[:-1])

    def objectives(self, device=None) -> torch.Tensor:
        """contrastive_weight * contrastive + transfer_weight * transfer, on fresh draws (visionpe.pos.seqpe_losses)."""
        total = torch.zeros((), device=device)
        if self.contrastive_weight:
            pivots, cands = sample_contrastive(PIVOTS, CANDIDATES, self.max_position, LOCAL_RATE, device)
            pe = self.encode(torch.cat([pivots[:, None], cands], 1))
            loss = contrastive_loss(pe[:, 0], pe[:, 1:], nearest_labels(pivots, cands))
            total = total + self.contrastive_weight * loss
        if self.transfer_weight:
            teacher, student = sample_transfer(BLOCKS, CELLS, transfer_grid(self.host), self.max_position, device)
            with torch.no_grad():
                target = self.encode(teacher)
            total = total + self.transfer_weight * transfer_loss(target, self.encode(student))
        return total

    def aux_loss(self) -> torch.Tensor | None:
        """The weighted objectives of the last training forward (then forgotten), None when there are none."""
        out, self._aux = self._aux, None
        return out

    def context(self, i, layout, kv_layout=None, own=None):
        if not own_grids(self.host):
            pe_q, pe_k = own(self._table(layout))
            if kv_layout is not None:
                pe_k = own(self._table(kv_layout))[1]
        else:
            ref = layer_grid(self.host, i)
            table = self._table(layout, ref)
            pe_q, pe_k = own(table)
            if kv_layout is not None:  # CvT: the keys read the query grid's PEs at their positions
                p, grid = layout.num_prefix, tuple(layout.grid[1:])
                cells = sample_cells(table[p:], grid, kv_layout.pos)
                pe_k = own(torch.cat([table[: kv_layout.num_prefix], cells]))[1]

        def rotate(q, k):
            return attn_mul(q, pe_q), attn_mul(k, pe_k)

        return PosContext(rotate=rotate)
