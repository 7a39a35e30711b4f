"""iRPE (Wu et al., ICCV 2021): image relative position encoding, and Swin's relative position bias as a special case.

Relative offsets (dr, dc) = (y_i - y_j, x_i - x_j) between query i and key j are mapped to buckets:
- index: `piecewise` g(x) (exact up to alpha, logarithmic up to gamma, saturating at +-beta; alpha:beta:gamma =
  1:2:8 x ratio, B = int(beta)) or `identity` (round(x) clamped to +-max_offset, B = max_offset);
- mapping: `euclidean` g(round(sqrt(dr^2 + dc^2))), `quantization` g(dr^2 + dc^2), `cross` (two tables, g(dr) and
  g(dc), summed) or `product` (g(dr) + B) * (2B + 1) + (g(dc) + B). Buckets: 2B + 1 ((2B + 1)^2 for product), plus
  one extra bucket (the last row) shared by every pair with a prefix token when the backbone has prefix tokens.
- mode `bias`: a learned scalar per bucket (and head) added to the scaled logits;
  mode `contextual`: on k, logit_ij += (q_i / sqrt(d)) . rK[b(i, j)]; on q, logit_ij += (k_j / sqrt(d)) . rQ[b(j, i)];
  on v, out_i += sum_j a_ij rV[b(i, j)] (needs the attention probabilities).
Contextual terms are computed as q @ table^T ([.., N, buckets]) and then looked up; nothing N x N x d is built. The
terms are handed to attention as row blocks (`RowBias`, `RowValue`), so that attention runs a block of queries at a
time and never holds an N x N bias or probability matrix (see `visionpe.attention.attend_rows`). Bucket ids are not
kept for the whole N x N grid either where it is large: the product and cross mappings on raster grids keep two small
per-axis tables and the product lookup runs as one-hot matmuls (`visionpe.pos.irpe_lookup`); other cases keep the
whole grid in uint8 / int16. The math backend keeps the whole-grid gather as the reference every route is tested on.
Swin's relative position bias = mode "bias", mapping "product", index "identity", shared_heads=False, B = ws - 1.

Each layer holds its tables (`blocks.{i}.attn.pos.irpe.<name>` in a ViT; zero unless init_std > 0); flat names, as
checkpoints before each layer owned its state and `convert_checkpoint` give them, in parentheses:
- mode "bias": `bias_k` (`bias_tables.{i}`, target k) and `bias_q` (`q_bias_tables.{i}`, target q, read at the
  mirrored bucket b(j, i)), each of shape [buckets, heads] (shared_heads=False; Swin's relative_position_bias_table
  layout) or [buckets, 1] (shared_heads=True). The official code keeps the two tables apart too (`rpe_k`, `rpe_q`).
- mode "contextual": `q`, `k`, `v` (`tables.{q|k|v}.{i}`) of shape [buckets, d] (shared_heads=True) or
  [heads, buckets, d].
For the cross mapping a table holds the row table then the column table: buckets = 2 * (2B + 1 [+ 1]).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from timm.layers import resize_rel_pos_bias_table, trunc_normal_
from torch import nn

from ..attention.rows import RowBias, RowValue
from ..fx import fx_unsupported, is_fx_tracing
from ..layout.tokens import TokenLayout
from .base import LayerParams, PEHost, PosContext, PosEncoding
from .irpe_checkpoint import IRPE_KEYS, SWIN_TABLE, irpe_tables, swin_tables
from .irpe_lookup import FullBuckets, GridBuckets
from .table_cache import TableCache

__all__ = ["IRPE", "piecewise_index", "relative_bucket_ids", "MAPPINGS", "MODES", "TARGETS", "INDEXES"]

# id grids up to this many (query, key) pairs are kept whole (2 MiB as int64: 224 px ViTs, Swin windows); larger
# product / cross grids use the separable per-axis form (`GridBuckets`)
SMALL_GRID_PAIRS = 1 << 18

MAPPINGS = ("euclidean", "quantization", "cross", "product")
MODES = ("bias", "contextual")
TARGETS = ("q", "k", "v")
INDEXES = ("piecewise", "identity")


def piecewise_index(rel: torch.Tensor, alpha: float, beta: float, gamma: float) -> torch.LongTensor:
    """iRPE's g(x): round(x) for |x| <= alpha, else sign(x) * min(beta, round(alpha + ln(|x| / alpha) /
    ln(gamma / alpha) * (beta - alpha))), truncated to an integer (so the largest id is int(beta))."""
    rel = rel.float()
    mag = rel.abs()
    far = alpha + torch.log(mag.clamp(min=alpha) / alpha) / math.log(gamma / alpha) * (beta - alpha)
    far = far.round().clamp(max=beta).trunc()
    return torch.where(mag <= alpha, rel.round(), torch.sign(rel) * far).long()


def _axis_index(x: torch.Tensor, index: str, ratio: float, b: int) -> torch.Tensor:
    """g(x) of one axis offset (or distance): identity round(x) clamped to +-b, or the piecewise index."""
    if index == "identity":
        return x.round().clamp(-b, b).long()
    return piecewise_index(x, ratio, 2 * ratio, 8 * ratio)


def _pair(x: int | tuple[int, int]) -> tuple[int, int]:
    return (int(x), int(x)) if isinstance(x, (int, float)) else (int(x[0]), int(x[1]))


def _offsets(index: str, ratio: float, max_offset) -> tuple[int, int]:
    """(B_rows, B_cols): the largest bucket offset per axis."""
    if index == "piecewise":
        b = int(2 * ratio)
        return b, b
    if max_offset is None:
        raise ValueError("index='identity' needs max_offset (e.g. window size - 1)")
    return _pair(max_offset)


def relative_bucket_ids(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    mapping: str,
    index: str = "piecewise",
    ratio: float = 1.9,
    max_offset: int | tuple[int, int] | None = None,
) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], int | tuple[int, int]]:
    """Bucket ids of every (query, key) pair from (x, y) positions q_pos [N, 2], k_pos [M, 2] (fractional allowed).

    Returns (ids [N, M] long, num_buckets); for mapping "cross" ((ids_rows, ids_cols), (buckets_rows, buckets_cols)),
    two tables whose lookups are summed. max_offset (int or (rows, cols)) is B for index "identity".
    """
    if mapping not in MAPPINGS:
        raise ValueError(f"unknown iRPE mapping {mapping!r}; choose one of {MAPPINGS}")
    if index not in INDEXES:
        raise ValueError(f"unknown iRPE index {index!r}; choose one of {INDEXES}")
    if q_pos.shape[-1] != 2 or k_pos.shape[-1] != 2:
        raise ValueError(f"iRPE needs (x, y) positions [N, 2], got {tuple(q_pos.shape)} and {tuple(k_pos.shape)}")
    br, bc = _offsets(index, ratio, max_offset)
    q_pos, k_pos = q_pos.float(), k_pos.float()
    dr = q_pos[:, None, 1] - k_pos[None, :, 1]  # [N, M] row offsets y_i - y_j
    dc = q_pos[:, None, 0] - k_pos[None, :, 0]  # [N, M] column offsets x_i - x_j

    def g(x: torch.Tensor, b: int) -> torch.Tensor:
        return _axis_index(x, index, ratio, b)

    if mapping == "product":
        return (g(dr, br) + br) * (2 * bc + 1) + (g(dc, bc) + bc), (2 * br + 1) * (2 * bc + 1)
    if mapping == "cross":
        return (g(dr, br) + br, g(dc, bc) + bc), (2 * br + 1, 2 * bc + 1)
    b = max(br, bc)
    sq = dr.square() + dc.square()
    dist = sq.sqrt().round() if mapping == "euclidean" else sq
    return g(dist, b) + b, 2 * b + 1


class IRPE(PosEncoding):
    """iRPE on the logits (bias, contextual q/k) and values (contextual v) of every attention layer.

    One table per layer and target, zero-initialised (a fresh model equals plain attention), shared across heads
    (shared_heads=True) or one per head. Per-layer heads and head dims come from host.layers (hierarchical
    backbones); with index "identity" and max_offset None, B = (window - 1) from the layer's grid (Swin).
    Published tables (the iRPE authors' DeiT, Swin's relative position bias) convert through irpe_checkpoint.py.
    """

    positive_options = ("ratio",)
    checkpoint_keys = {"vit": IRPE_KEYS, "swin": SWIN_TABLE}
    checkpoint_buffers = {"swin": r"\.relative_position_index$"}

    def __init__(
        self,
        host: PEHost,
        mode: str = "contextual",
        mapping: str = "product",
        targets: tuple[str, ...] | list[str] | str = ("k",),
        ratio: float = 1.9,
        shared_heads: bool = True,
        index: str = "piecewise",
        max_offset: int | tuple[int, int] | None = None,
        init_std: float = 0.0,
    ):
        """init_std > 0: `init_weights` draws the tables from a truncated normal (Swin's relative position bias
        uses 0.02); 0 keeps them at zero."""
        super().__init__(host)
        targets = tuple(targets)  # "qkv" or ("q", "k", "v")
        if mode not in MODES:
            raise ValueError(f"unknown iRPE mode {mode!r}; choose one of {MODES}")
        if mapping not in MAPPINGS:
            raise ValueError(f"unknown iRPE mapping {mapping!r}; choose one of {MAPPINGS}")
        if index not in INDEXES:
            raise ValueError(f"unknown iRPE index {index!r}; choose one of {INDEXES}")
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets or len(set(targets)) != len(targets):
            raise ValueError(f"iRPE targets must be distinct entries of {TARGETS}, got {targets}")
        if mode == "bias" and "v" in targets:
            raise ValueError("iRPE mode 'bias' adds scalars to the logits and has no v term; use mode='contextual'")
        if index == "piecewise" and not ratio > 0:
            raise ValueError(f"iRPE ratio must be > 0 (alpha:beta:gamma = 1:2:8 x ratio), got {ratio}")
        if index == "piecewise" and int(2 * ratio) < 1:
            raise ValueError(f"iRPE ratio {ratio} gives beta < 1 (a single bucket); use ratio >= 0.5")
        if max_offset is not None and min(_pair(max_offset)) < 0:
            raise ValueError(f"iRPE max_offset must be >= 0, got {max_offset}")
        self.mode, self.mapping, self.index = mode, mapping, index
        self.targets = tuple(t for t in TARGETS if t in targets)  # canonical order q, k, v
        self.ratio, self.shared_heads, self.max_offset = float(ratio), shared_heads, max_offset
        self.init_std = float(init_std)
        self.extra_bucket = host.num_prefix > 0  # one bucket shared by every pair with a prefix token
        self.offsets = [self._layer_offsets(spec.grid) for spec in host.layers]  # (B_rows, B_cols) per layer
        self.rows = [self._table_rows(b) for b in self.offsets]
        self._ids_cache = TableCache(size=16, by_value=True)  # bucket ids per (positions, prefixes, B)

    # flat names (checkpoints; the model-level PE before each layer held its tables) -> layer i's names
    layer_names = {
        r"bias_tables\.(?P<i>\d+)": "bias_k",
        r"q_bias_tables\.(?P<i>\d+)": "bias_q",
        r"tables\.(?P<t>[qkv])\.(?P<i>\d+)": "{t}",
    }

    def table_shape(self, i: int) -> tuple[int, ...]:
        """Layer i's table shape: bias [buckets, heads | 1]; contextual [buckets, d] or [heads, buckets, d]."""
        r, spec = self.rows[i], self.host.layers[i]
        if self.mode == "bias":
            return (r, 1 if self.shared_heads else spec.num_heads)
        return (r, spec.head_dim) if self.shared_heads else (spec.num_heads, r, spec.head_dim)

    def _initial(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's tables: zero, or drawn (truncated normal, init_std) when init_std > 0. Bias mode keeps one
        table per target, as the official code: on k, logit_ij += rK[b(i, j)] (`bias_k`); on q, logit_ij +=
        rQ[b(j, i)], the mirrored bucket (`bias_q`); one merged table is not weight-compatible."""
        names = [f"bias_{t}" for t in self.targets] if self.mode == "bias" else list(self.targets)
        out = {n: torch.zeros(self.table_shape(i)) for n in names}
        for t in out.values() if self.init_std > 0 else ():
            trunc_normal_(t, std=self.init_std)
        return out

    def layer(self, i):
        """Layer i's tables, excluded from weight decay (as Swin does for its relative position bias table)."""
        return LayerParams(partial(self._initial, i), decay=False)

    def set_host(self, host, layers=()):
        """A new host (e.g. Swin with a new window): tables whose bucket range follows the window are resized
        (bias tables bicubically, as timm does for Swin checkpoints); contextual tables cannot follow one."""
        offsets = [self._layer_offsets(spec.grid) for spec in host.layers]
        old, self.host = self.offsets, host
        if offsets == old[: len(offsets)]:  # the same windows (a pruned backbone: fewer layers)
            self.offsets, self.rows = offsets, self.rows[: len(offsets)]
            return
        if self.mode != "bias" or self.extra_bucket:
            raise ValueError(
                "iRPE tables sized by the attention window cannot follow a new window in contextual mode or with "
                "prefix tokens; set max_offset or use index='piecewise' (its buckets do not depend on the window)"
            )
        with torch.no_grad():
            for own, a, b in zip(layers, old, offsets):
                for name, t in list(own.named_parameters()) if a != b else ():
                    shape = (self._table_rows(b), t.shape[1])
                    new = resize_rel_pos_bias_table(t.data, (b[0] + 1, b[1] + 1), shape, (a[0] + 1, a[1] + 1))
                    setattr(own, name, nn.Parameter(new.contiguous(), requires_grad=t.requires_grad))
        self.offsets, self.rows = offsets, [self._table_rows(b) for b in offsets]

    # ------------------------------------------------------------------------------------------------ buckets

    def _layer_offsets(self, grid: tuple[int, int] | None) -> tuple[int, int]:
        if self.index == "piecewise":
            return _offsets("piecewise", self.ratio, None)
        if self.max_offset is not None:
            return _pair(self.max_offset)
        h, w = grid if grid is not None else self.host.grid  # the window (Swin) or the reference grid
        return h - 1, w - 1

    def _axis_buckets(self, b: tuple[int, int]) -> list[int]:
        """Buckets of each table part (two for cross), without the prefix bucket."""
        br, bc = b
        if self.mapping == "product":
            return [(2 * br + 1) * (2 * bc + 1)]
        if self.mapping == "cross":
            return [2 * br + 1, 2 * bc + 1]
        return [2 * max(br, bc) + 1]

    def _table_rows(self, b: tuple[int, int]) -> int:
        return sum(n + self.extra_bucket for n in self._axis_buckets(b))

    def num_buckets(self, i: int = 0) -> int:
        """Rows of layer i's table (prefix bucket and both cross tables included)."""
        return self.rows[i]

    def _ids(self, q: TokenLayout, k: TokenLayout, b: tuple[int, int]) -> list[torch.Tensor]:
        """Table rows of every pair [P + N, Pk + M] (one tensor per table part), prefix pairs on the extra bucket."""
        if (q.num_prefix or k.num_prefix) and not self.extra_bucket:
            raise ValueError(
                "iRPE was built for a backbone without prefix tokens but the layout has some; "
                "build the PE with a PEHost whose num_prefix matches the tokens"
            )
        ids, _ = relative_bucket_ids(q.pos, k.pos, self.mapping, self.index, self.ratio, b)
        parts = list(ids) if isinstance(ids, tuple) else [ids]
        out, start = [], 0
        for part, n in zip(parts, self._axis_buckets(b)):
            if self.extra_bucket:
                full = part.new_full((q.num_tokens, k.num_tokens), n)
                full[q.num_prefix :, k.num_prefix :] = part
                part = full
            out.append(part + start)
            start += n + self.extra_bucket
        return out

    def _grid_buckets(self, q: TokenLayout, k: TokenLayout, b: tuple[int, int]) -> GridBuckets | None:
        """The separable form of the product / cross ids between two raster grids whose positions are the product
        of a row coordinate and a column coordinate (checked in eager mode; a traced graph trusts `grid`)."""
        if self.mapping not in ("product", "cross") or q.grid is None or k.grid is None:
            return None
        if q.grid[0] != 1 or k.grid[0] != 1 or (q.num_tokens * k.num_tokens) <= SMALL_GRID_PAIRS:
            return None
        (hq, wq), (hk, wk) = q.hw, k.hw
        qp, kp = q.pos.view(hq, wq, 2), k.pos.view(hk, wk, 2)
        qy, qx, ky, kx = qp[:, 0, 1], qp[0, :, 0], kp[:, 0, 1], kp[0, :, 0]
        if not torch.compiler.is_compiling():
            for p, y, x in ((qp, qy, qx), (kp, ky, kx)):
                if not (
                    torch.equal(p[..., 0], x.expand_as(p[..., 0]))
                    and torch.equal(p[..., 1], y[:, None].expand_as(p[..., 1]))
                ):
                    return None  # not a product grid: the whole id grid
        br, bc = b
        axis_y = _axis_index(qy[:, None] - ky[None, :], self.index, self.ratio, br) + br  # [H_q, H_k]
        axis_x = _axis_index(qx[:, None] - kx[None, :], self.index, self.ratio, bc) + bc  # [W_q, W_k]
        prefix = (q.num_prefix, k.num_prefix)
        return GridBuckets(
            axis_y, axis_x, (2 * br + 1, 2 * bc + 1), self.mapping == "product", prefix, self.extra_bucket
        )

    def _buckets(self, q: TokenLayout, k: TokenLayout, b: tuple[int, int]) -> GridBuckets | FullBuckets:
        """The bucket ids of every pair, in the separable per-axis form where it applies, else whole (compact)."""
        if (q.num_prefix or k.num_prefix) and not self.extra_bucket:
            self._ids(q, k, b)  # raises the prefix error
        grid = self._grid_buckets(q, k, b)
        return grid if grid is not None else FullBuckets(self._ids(q, k, b), self._table_rows(b))

    def _cached_ids(self, q: TokenLayout, k: TokenLayout, b: tuple[int, int]) -> GridBuckets | FullBuckets:
        """`_buckets`, cached per (positions, prefixes, B); equal positions in a new tensor also hit. Traced into
        the graph: no value check (a graph break), no Python state."""
        key = (b, q.num_prefix, k.num_prefix)
        return self._ids_cache.lookup(key, lambda: self._buckets(q, k, b), (q.pos, k.pos))

    # ------------------------------------------------------------------------------------------------ tables

    # ------------------------------------------------------------------------------------------------ sites

    def context(self, i, layout, kv_layout=None, own=None):
        if is_fx_tracing():
            fx_unsupported("iRPE (its bucket lookup is chosen per input size)")
        if layout.streams != 2:
            raise ValueError(f"iRPE needs (x, y) positions, got a layout with {layout.streams} streams")
        kv = layout if kv_layout is None else kv_layout
        b = self.offsets[i]
        on_k = "k" in self.targets
        on_q = "q" in self.targets
        ids_k = self._cached_ids(layout, kv, b) if on_k or "v" in self.targets else None
        ids_q = self._cached_ids(kv, layout, b) if on_q else None  # [M, N]: keys play the queries' part
        if self.mode == "bias":
            tables = (own.bias_k if on_k else None, own.bias_q if on_q else None)
            bias = _BucketLogits("bias", ids_k if on_k else None, ids_q, *tables)
            return PosContext(bias=bias)
        tables = (own.k if on_k else None, own.q if on_q else None)
        bias = _BucketLogits("contextual", ids_k if on_k else None, ids_q, *tables) if on_k or on_q else None
        value = _BucketValues(ids_k, own.v, self.rows[i]) if "v" in self.targets else None
        return PosContext(bias=bias, value=value, needs_probs=value is not None)

    def convert_checkpoint(self, entries, source):
        return (swin_tables if source.layout == "swin" else irpe_tables)(self, entries, source)

    @classmethod
    def absent_message(cls, key, source):
        if source.layout == "swin":
            return (
                f"the checkpoint has Swin's relative position bias but the model's PE is {source.pe_name!r}; load it "
                "into the rpb preset (e.g. swin_t_rpb), or drop the tables and train the new PE (strict=False)"
            )
        return (
            f"the checkpoint has iRPE ({key}) but the model's PE {source.pe_name!r} has none there; "
            "use the matching preset (irpe for rpe_k, irpe_qkv for rpe_q/k/v)"
        )


def _gather_rows(lut: torch.Tensor, ids: list[torch.Tensor]) -> torch.Tensor:
    """out[.., l, j] = sum over table parts of lut[.., l, ids[l, j]] for lut [B, H, L, R], ids [L, J]."""
    shape = (*lut.shape[:-1], ids[0].shape[-1])
    out = lut.gather(-1, ids[0].expand(shape))
    for extra in ids[1:]:  # cross: the column table
        out = out.add_(lut.gather(-1, extra.expand(shape)))
    return out


Buckets = GridBuckets | FullBuckets


def _product_grid(ids: Buckets | None) -> bool:
    """Whether the contextual lookup can run as the separable one-hot matmuls (product mapping on grids)."""
    return isinstance(ids, GridBuckets) and ids.product


def _banded(ids: Buckets | None, lead: int) -> bool:
    """Whether the lookup copies runs of grid rows (for `lead` = batch x heads matrices): in eager mode on the CPU,
    where it pays off (`GridBuckets.runs_pay_off`). The runs are read on the host, which a traced graph cannot do,
    and each is a small copy, measured on the CPU only (on a GPU the few batched products are fewer kernel
    launches); elsewhere the one-hot products and gathers."""
    return (
        _product_grid(ids)
        and ids.axis_y.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and ids.runs_pay_off(lead)
    )


def _product_lookup(ids: GridBuckets, lut: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """lut[.., i, b(i, j)] for query rows [start, stop): by runs of grid rows where they pay off for lut's
    batch x heads matrices, else by the one-hot products."""
    banded = _banded(ids, lut.shape[:-2].numel())
    return (ids.lookup_banded if banded else ids.lookup)(lut, start, stop)


class _BucketLogits(RowBias):
    """iRPE's logits terms, a block of query rows at a time (nothing N x N is built beyond the rows asked for).

    contextual: on k, logit_ij += (q_i / sqrt(d)) . rK[b(i, j)], as q_i @ rK^T ([.., rows, buckets]) then looked up;
    on q, logit_ij += (k_j / sqrt(d)) . rQ[b(j, i)], from k @ rQ^T computed once for all keys.
    bias: logit_ij += rK[b(i, j)] (+ rQ[b(j, i)]), a scalar per bucket and head (or shared).
    ids_k (pairs (i, j)) and ids_q (pairs (j, i)) are bucket-id sources (`visionpe.pos.irpe_lookup`). Calling the
    object (the whole matrix, used by the math backend) is the reference: a plain gather over the whole id grid."""

    def __init__(self, mode, ids_k: Buckets | None, ids_q: Buckets | None, table_k, table_q):
        self.mode, self.ids_k, self.ids_q, self.table_k, self.table_q = mode, ids_k, ids_q, table_k, table_q

    @staticmethod
    def _keys_first(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """table [R, d] | [H, R, d] -> (table / sqrt(d))^T in x's dtype: [d, R] | [H, d, R]."""
        return (table * x.shape[-1] ** -0.5).to(x.dtype).transpose(-1, -2)

    def prepare(self, q, k):
        return self._prepare(q, k, row_blocks=True)

    def __call__(self, q, k):
        return self._terms(self._prepare(q, k, row_blocks=False), 0, q.shape[-2], reference=True)

    def _prepare(self, q, k, row_blocks: bool):
        """(q, lut_q, columns): the q term's k @ rQ^T for every key ([B, H, M, R]); for banded row blocks instead
        the table its runs are copied from (`columns`) and, of lut_q, only the prefix bucket (None without one)."""
        lut_q = columns = None
        if self.mode == "contextual" and self.table_q is not None:
            lut_q = k @ self._keys_first(self.table_q, k)
            if row_blocks and _banded(self.ids_q, k.shape[:-2].numel()):
                columns = self.ids_q.columns_table(lut_q)
                lut_q = lut_q[..., -1].contiguous() if self.ids_q.extra_ids is not None else None
        return q, lut_q, columns

    def rows(self, state, start, stop):
        return self._terms(state, start, stop, reference=False)

    def _terms(self, state, start: int, stop: int, reference: bool) -> torch.Tensor:
        q, lut_q, columns = state

        def ids_k():  # [rows, M] per table part
            return [t[start:stop] for t in self.ids_k.full()] if reference else self.ids_k.block(start, stop)

        def ids_q():  # [M, rows] per table part
            return [t[:, start:stop] for t in self.ids_q.full()] if reference else self.ids_q.block_t(start, stop)

        fast_k = not reference and _product_grid(self.ids_k)
        out = None
        if self.mode == "bias":
            if self.table_k is not None:
                if fast_k:  # the table as a per-head lut shared by every row: [1, H | 1, rows, R]
                    lut = self.table_k.to(q.dtype).t()[None, :, None, :].expand(1, -1, stop - start, -1)
                    out = _product_lookup(self.ids_k, lut, start, stop)
                else:  # [rows, M, H | 1] -> [1, H | 1, rows, M]
                    out = sum(self.table_k[t] for t in ids_k()).permute(2, 0, 1)[None]
            if self.table_q is not None:  # [M, rows, H | 1] -> [1, H | 1, rows, M]
                t_q = sum(self.table_q[t] for t in ids_q()).permute(2, 1, 0)[None]
                out = t_q if out is None else out.add_(t_q)
            return out.to(q.dtype)
        if self.table_k is not None:
            lut = q[:, :, start:stop] @ self._keys_first(self.table_k, q)  # [B, H, rows, R]
            out = _product_lookup(self.ids_k, lut, start, stop) if fast_k else _gather_rows(lut, ids_k())
        if columns is not None:  # [B, H, rows, M], read by key j, added in place
            out = self.ids_q.lookup_transposed(columns, lut_q, start, stop, into=out)
        elif lut_q is not None:  # [B, H, M, rows] -> [B, H, rows, M]
            t_q = _gather_rows(lut_q, ids_q()).transpose(-1, -2)
            out = t_q if out is None else out.add_(t_q)
        return out


class _BucketValues(RowValue):
    """iRPE on v: out_i += sum_j a_ij rV[b(i, j)] = sum_b (sum_{j: b(i, j) = b} a_ij) rV[b], the probabilities
    summed per bucket ([.., rows, buckets]) and multiplied by the table."""

    def __init__(self, ids: Buckets, table, buckets):
        self.ids, self.table, self.buckets = ids, table, buckets

    def __call__(self, v, out, probs):
        if probs is None:
            raise RuntimeError("this value term needs the attention probabilities (PosContext.needs_probs)")
        return out + self._term(probs, self.ids.full())

    def rows(self, probs, start, stop):
        if _product_grid(self.ids):  # sums per bucket by runs of grid rows / one-hot products: no ids, no scatter
            sums = self.ids.bucket_sums_banded if _banded(self.ids, probs.shape[:-2].numel()) else self.ids.bucket_sums
            return sums(probs, start, stop, self.buckets) @ self.table.to(probs.dtype)
        return self._term(probs, self.ids.block(start, stop))

    def _term(self, probs: torch.Tensor, ids: list[torch.Tensor]) -> torch.Tensor:
        per_bucket = probs.new_zeros(*probs.shape[:-1], self.buckets)  # [B, H, rows, R]
        for t in ids:
            per_bucket.scatter_add_(-1, t.expand_as(probs), probs)
        return per_bucket @ self.table.to(probs.dtype)
