"""Attention biases that depend only on the offset between a query and a key: bias[h, i, j] = f_h(u, v) with
(u, v) = (x_j - x_i, y_j - y_i) the key's position minus the query's (y grows downward), and no bias for any pair
with a prefix token (CLS, registers). 2D ALiBi, LookHere and 2D FIRE are such biases (`OffsetBiasPE` subclasses).

The bias goes to attention as a `RowBias` (`visionpe.attention.attend_rows`): one block of query rows at a time, so
at most [1, H, rows, M] of it exists, never [B, H, N, M]. Two routes give each block, equal by construction (the
same f on the same float64 offsets):
- grid route: queries and keys lie on axis-aligned lattices (ViT patches, Swin windows, CvT's stride-2 keys at cell
  centres, 'interpolate' positions) whose key step is a whole multiple r of the query step. Then the offsets along
  x take L_x = r (W_k - 1) + W_q values (likewise y), and f is evaluated once per grid on that set: a table
  [H, L_y, L_x] (cached while it is a constant). Laid out once per call as P[h, x_q, t_y, x_k], the keys of one query
  grid row y_q are the strided window t_y = (H_q - 1 - y_q) + r_y * y_k of P, so a block is one copy per query grid
  row, without an N x M index or a per-pair evaluation.
- direct route: f on the offsets of the block's queries against every key, for any (x, y) layout; it also serves
  traced graphs (torch.compile), where the lattice cannot be read on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention.rows import RowBias
from ..fx import fx_unsupported, is_fx_tracing
from ..layout.tokens import TokenLayout
from .base import PosContext, PosEncoding
from .table_cache import TableCache

__all__ = ["OffsetBias", "OffsetBiasPE", "GridPlan", "grid_plan"]

OffsetFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (u, v) float64 [...] -> bias [H, ...]


@dataclass(frozen=True)
class _Lattice:
    """One axis of a raster grid: positions origin + step * arange(n)."""

    origin: float
    step: float
    n: int


def _lattice(values: list[float]) -> _Lattice | None:
    step = values[1] - values[0] if len(values) > 1 else 0.0
    for i, v in enumerate(values):
        if abs(v - (values[0] + step * i)) > 1e-6 * max(1.0, abs(v)):
            return None
    if len(values) > 1 and step <= 0:
        return None
    return _Lattice(values[0], step, len(values))


def _axes(layout: TokenLayout) -> tuple[_Lattice, _Lattice] | None:
    """The (x, y) lattices of a raster image layout whose positions are a product of two progressions, else None."""
    if layout.grid is None or layout.grid[0] != 1 or layout.streams != 2:
        return None
    h, w = layout.hw
    p = layout.pos.view(h, w, 2)
    x, y = p[0, :, 0], p[:, 0, 1]
    if not (torch.equal(p[..., 0], x.expand(h, w)) and torch.equal(p[..., 1], y[:, None].expand(h, w))):
        return None
    ax, ay = _lattice(x.double().tolist()), _lattice(y.double().tolist())
    return None if ax is None or ay is None else (ax, ay)


@dataclass(frozen=True)
class GridPlan:
    """The grid route's geometry: per axis the offsets the table is evaluated at (t = 0 .. L - 1), the key step in
    query steps (r) and the grid sizes."""

    ux: torch.Tensor  # [L_x] float64
    uy: torch.Tensor  # [L_y] float64
    rx: int
    ry: int
    hq: int
    wq: int
    hk: int
    wk: int


def _axis_offsets(q: _Lattice, k: _Lattice) -> tuple[torch.Tensor, int] | None:
    """Offsets u(t) = k.origin - q.origin + q_step * (t - (n_q - 1)) for t = 0 .. r (n_k - 1) + n_q - 1, and r."""
    q_step = q.step if q.n > 1 else (k.step if k.n > 1 else 1.0)
    r = 1.0 if k.n == 1 else k.step / q_step
    if abs(r - round(r)) > 1e-6 or round(r) < 1:
        return None
    r = int(round(r))
    t = torch.arange(r * (k.n - 1) + q.n, dtype=torch.float64)
    return (k.origin - q.origin) + q_step * (t - (q.n - 1)), r


def grid_plan(q: TokenLayout, k: TokenLayout) -> GridPlan | None:
    """The grid route's plan for queries q and keys k (read on the host), or None where it does not apply."""
    qa, ka = _axes(q), _axes(k)
    if qa is None or ka is None:
        return None
    x, y = _axis_offsets(qa[0], ka[0]), _axis_offsets(qa[1], ka[1])
    if x is None or y is None:
        return None
    return GridPlan(x[0], y[0], x[1], y[1], qa[1].n, qa[0].n, ka[1].n, ka[0].n)


WHOLE_ELEMENTS = 1 << 20  # constant biases of up to this many elements ([H, Pq + N, Pk + M]) are cached whole (eval)


def _relayout(table: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    """[H, L_y, L_x] -> P[h, x_q, t_y, x_k] = table[h, t_y, r_x * x_k + (W_q - 1 - x_q)] (contiguous): one strided
    copy per query column."""
    out = table.new_empty(table.shape[0], plan.wq, table.shape[1], plan.wk)
    span = plan.rx * (plan.wk - 1) + 1
    for xq in range(plan.wq):
        b0 = plan.wq - 1 - xq
        out[:, xq] = table[:, :, b0 : b0 + span : plan.rx]
    return out


class _Store:
    """Where an OffsetBias gets its grid-route tensors: the table (built in the forward for a learned f in training,
    else cached by the PE: `key`, computed from `sources`), its layout P, a whole cached bias for small grids, and a
    reusable block buffer."""

    def __init__(self, pe: OffsetBiasPE, key, sources: tuple, build: Callable[[], torch.Tensor], plan: GridPlan):
        self.pe, self.key, self.sources, self.build, self.plan = pe, key, sources, build, plan

    def _cached(self, key, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        return self.pe._tables.lookup(key, make, sources=self.sources)

    def laid(self, dtype: torch.dtype) -> torch.Tensor:
        if self.key is None:
            return _relayout(self.build().to(dtype), self.plan)
        table = self._cached(self.key, self.build)
        if self.pe.cache_layout:  # layers share the table: lay it out once per dtype
            return self._cached((self.key, "laid", dtype), lambda: _relayout(table.to(dtype), self.plan))
        return _relayout(table.to(dtype), self.plan)

    def whole(self, bias: OffsetBias, dtype: torch.dtype) -> torch.Tensor | None:
        """The whole [1, H, Pq + N, Pk + M] bias, cached per dtype, for a constant f on a small grid (else None)."""
        n, m = bias.q.num_tokens, bias.kv.num_tokens
        if self.key is None or torch.is_grad_enabled() or bias.heads * n * m > WHOLE_ELEMENTS:
            return None
        return self._cached((self.key, "whole", dtype), lambda: bias.block((dtype, self.laid(dtype), None), 0, n))

    def scratch(self, shape: tuple[int, ...], dtype: torch.dtype, device, pk: int) -> torch.Tensor | None:
        """A block buffer reused from block to block and call to call where no autograd graph can hold it (its
        prefix columns stay zero: nothing else writes them)."""
        if torch.is_grad_enabled():
            return None
        buf = self.pe._scratch
        key = (shape[0], shape[1], shape[3], pk, dtype, str(device))
        if buf is None or buf[0] != key or buf[1].shape[2] < shape[2]:
            with torch.inference_mode(False):
                t = torch.zeros(shape, dtype=dtype, device=device)
            self.pe._scratch = buf = (key, t)
        return buf[1][:, :, : shape[2]]


class OffsetBias(RowBias):
    """The logits bias f_h(u, v) between the grid tokens of `q_layout` and `kv_layout`, a block of query rows at a
    time ([1, H, rows, Pk + M], zero on prefix rows and columns). `store` gives the grid route's tensors (None:
    direct route); `fn` evaluates f on offset tensors."""

    def __init__(self, fn: OffsetFn, heads: int, q: TokenLayout, kv: TokenLayout, plan, store: _Store | None):
        self.fn, self.heads, self.q, self.kv, self.plan, self.store = fn, heads, q, kv, plan, store

    def prepare(self, q, k):
        if self.store is None:
            return q.dtype, None, None
        whole = self.store.whole(self, q.dtype)
        return q.dtype, None if whole is not None else self.store.laid(q.dtype), whole

    def __call__(self, q, k):  # the whole bias, never in the reused block buffer (a caller may keep it)
        state = self.prepare(q, k)
        return state[2] if state[2] is not None else self.block(state, 0, q.shape[-2])

    def rows(self, state, start, stop):
        whole = state[2]
        return whole[:, :, start:stop] if whole is not None else self.block(state, start, stop, reuse=True)

    def block(self, state, start: int, stop: int, reuse: bool = False) -> torch.Tensor:
        dtype, laid, _ = state
        pq, pk = self.q.num_prefix, self.kv.num_prefix
        g0 = min(max(start, pq), stop)  # first grid query of the block
        shape = (1, self.heads, stop - start, pk + self.kv.num_pos)
        out = self.store.scratch(shape, dtype, self.q.pos.device, pk) if reuse and self.store is not None else None
        if out is None:
            out = torch.empty(shape, dtype=dtype, device=self.q.pos.device)
            if pk:
                out[:, :, g0 - start :, :pk].zero_()
        if g0 > start:
            out[:, :, : g0 - start].zero_()
        if g0 == stop:
            return out
        grid = out[0, :, g0 - start :, pk:]  # [H, g, M]
        if laid is None:
            qpos, kpos = self.q.pos[g0 - pq : stop - pq].double(), self.kv.pos.double()
            u = kpos[None, :, 0] - qpos[:, None, 0]
            v = kpos[None, :, 1] - qpos[:, None, 1]
            grid.copy_(self.fn(u, v))
        else:
            self._copy_rows(grid, laid, g0 - pq, stop - pq)
        return out

    def _copy_rows(self, grid: torch.Tensor, laid: torch.Tensor, first: int, stop: int) -> None:
        """Fill grid [H, stop - first, M] for grid queries [first, stop): one strided copy per query grid row."""
        p = self.plan
        keys = grid.unflatten(-1, (p.hk, p.wk))  # [H, g, H_k, W_k] view
        for yq in range(first // p.wq, (stop - 1) // p.wq + 1):
            i0, i1 = max(yq * p.wq, first), min((yq + 1) * p.wq, stop)
            t0 = p.hq - 1 - yq
            window = laid[:, i0 - yq * p.wq : i1 - yq * p.wq, t0 : t0 + p.ry * (p.hk - 1) + 1 : p.ry]
            keys[:, i0 - first : i1 - first].copy_(window)


class OffsetBiasPE(PosEncoding):
    """Base of the offset biases. A subclass gives `offset_fn(i, q, kv)` (f of layer i), `table_key(i)` (layers with
    equal keys share one table), `table_sources(i)` (the parameters f reads: a cached table is found again only while
    they are unchanged) and `constant()` (whether f is fixed, so its tables can be cached: always for parameter-free
    biases, in eval for learned ones, which set `learned`); `heads(i)` defaults to the host's head count.
    `cache_layout`: layers share tables, so the laid-out P ([H, W_q, L_y, W_k], O(H N) elements) is cached too (per
    dtype). Tables and plans are kept in TableCaches (visionpe.pos.table_cache), which the model forgets."""

    cache_layout = True
    learned = False  # f has trained parameters (its cached tables are forgotten at a train / eval switch)

    def __init__(self, host):
        super().__init__(host)
        self._plans = TableCache(size=16, by_value=True)  # grid_plan per (queries, keys)
        self._tables = TableCache(size=64, learned=self.learned)  # tables, laid-out P, whole biases
        self._scratch = None

    def heads(self, i: int) -> int:
        return self.host.layers[i].num_heads

    def offset_fn(self, i: int, q: TokenLayout, kv: TokenLayout) -> OffsetFn:
        raise NotImplementedError

    def table_key(self, i: int) -> object:
        return i

    def table_sources(self, i: int) -> tuple[torch.Tensor, ...]:
        """The tensors layer i's f is computed from (its cached tables are found again while they are unchanged)."""
        return ()

    def constant(self) -> bool:
        return True

    def context(self, i, layout, kv_layout=None, own=None):
        if layout.streams != 2:
            raise ValueError(
                f"{type(self).__name__} needs (x, y) positions, got a layout with {layout.streams} streams"
            )
        if is_fx_tracing():
            fx_unsupported(f"{type(self).__name__} (its bias tables are planned per input size)")
        kv = layout if kv_layout is None else kv_layout
        fn = self.offset_fn(i, layout, kv)
        host_side = torch.compiler.is_compiling() or layout.pos.is_meta  # the plan reads positions' values
        plan = None if host_side else self._plan(layout, kv)
        store = None if plan is None else self._store(i, fn, plan, layout, kv)
        return PosContext(bias=OffsetBias(fn, self.heads(i), layout, kv, plan, store))

    @staticmethod
    def _layout_key(t: TokenLayout) -> tuple:
        return (t.num_prefix, t.grid, tuple(t.pos.shape), str(t.pos.device))

    def _plan(self, q: TokenLayout, kv: TokenLayout) -> GridPlan | None:
        """`grid_plan`, cached per layout structure; equal positions in a new tensor also hit."""
        key = (self._layout_key(q), self._layout_key(kv))
        return self._plans.lookup(key, lambda: (grid_plan(q, kv),), (q.pos, kv.pos))[0]  # (None: no grid route)

    def _store(self, i: int, fn: OffsetFn, plan: GridPlan, q: TokenLayout, kv: TokenLayout) -> _Store:
        """Layer i's grid-route tensors: cached while f is constant, else built in the forward (so that gradients
        reach f's parameters)."""
        dev = q.pos.device

        def build() -> torch.Tensor:
            u = plan.ux.to(dev)[None, :].expand(len(plan.uy), -1)
            v = plan.uy.to(dev)[:, None].expand(-1, len(plan.ux))
            return fn(u, v)

        if not self.constant():
            return _Store(self, None, (), build, plan)
        ends = (plan.ux[0].item(), plan.ux[-1].item(), plan.uy[0].item(), plan.uy[-1].item())  # the offsets' range
        key = (self.table_key(i), self._layout_key(q), self._layout_key(kv), ends)
        return _Store(self, key, self.table_sources(i), build, plan)
