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

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention import RowBias
from ..layout import TokenLayout
from .base import PosContext, PosEncoding

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


def _relayout(table: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    """[H, L_y, L_x] -> P[h, x_q, t_y, x_k] = table[h, t_y, r_x * x_k + (W_q - 1 - x_q)] (contiguous)."""
    dev = table.device
    cols = (
        plan.rx * torch.arange(plan.wk, device=dev)[None, :]
        + (plan.wq - 1 - torch.arange(plan.wq, device=dev))[:, None]
    )
    return table[:, :, cols].permute(0, 2, 1, 3).contiguous()


class OffsetBias(RowBias):
    """The logits bias f_h(u, v) between the grid tokens of `q_layout` and `kv_layout`, a block of query rows at a
    time ([1, H, rows, Pk + M], zero on prefix rows and columns). `table()` gives the grid route's [H, L_y, L_x]
    (None: direct route); `fn` evaluates f on offset tensors."""

    def __init__(self, fn: OffsetFn, heads: int, q: TokenLayout, kv: TokenLayout, plan, table):
        self.fn, self.heads, self.q, self.kv, self.plan, self.table = fn, heads, q, kv, plan, table

    def prepare(self, q, k):
        if self.plan is None:
            return q.dtype, None
        return q.dtype, _relayout(self.table().to(q.dtype), self.plan)

    def rows(self, state, start, stop):
        dtype, laid = state
        pq, pk = self.q.num_prefix, self.kv.num_prefix
        g0 = min(max(start, pq), stop)  # first grid query of the block
        out = torch.empty(1, self.heads, stop - start, pk + self.kv.num_pos, dtype=dtype, device=self.q.pos.device)
        if g0 > start:
            out[:, :, : g0 - start].zero_()
        if pk:
            out[:, :, g0 - start :, :pk].zero_()
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
    equal keys share one table) and `constant()` (whether f is fixed, so its tables can be cached: always for
    parameter-free biases, in eval for learned ones); `heads(i)` defaults to the host's head count."""

    def __init__(self, host):
        super().__init__(host)
        self._plans: OrderedDict = OrderedDict()
        self._tables: OrderedDict = OrderedDict()

    def heads(self, i: int) -> int:
        return self.host.layers[i].num_heads

    def offset_fn(self, i: int, q: TokenLayout, kv: TokenLayout) -> OffsetFn:
        raise NotImplementedError

    def table_key(self, i: int) -> object:
        return i

    def constant(self) -> bool:
        return True

    def init_non_persistent_buffers(self) -> None:
        """No non-persistent buffers: the tables are rebuilt from the layouts on demand; drop the cached ones."""
        self._plans.clear()
        self._tables.clear()

    def set_host(self, host):
        super().set_host(host)
        self.init_non_persistent_buffers()

    def context(self, i, layout, kv_layout=None):
        if layout.streams != 2:
            raise ValueError(
                f"{type(self).__name__} needs (x, y) positions, got a layout with {layout.streams} streams"
            )
        kv = layout if kv_layout is None else kv_layout
        fn = self.offset_fn(i, layout, kv)
        plan = None if torch.compiler.is_compiling() else self._plan(layout, kv)
        table = None
        if plan is not None:
            table = self._table_getter(i, fn, plan, layout, kv)
        return PosContext(bias=OffsetBias(fn, self.heads(i), layout, kv, plan, table))

    @staticmethod
    def _layout_key(t: TokenLayout) -> tuple:
        return (t.num_prefix, t.grid, tuple(t.pos.shape), str(t.pos.device))

    def _plan(self, q: TokenLayout, kv: TokenLayout) -> GridPlan | None:
        """`grid_plan`, cached per layout structure; equal positions in a new tensor also hit."""
        key = (self._layout_key(q), self._layout_key(kv))
        hit = self._plans.get(key)
        if hit is not None:
            qp, kp, plan = hit
            if (qp is q.pos or torch.equal(qp, q.pos)) and (kp is kv.pos or torch.equal(kp, kv.pos)):
                return plan
        plan = grid_plan(q, kv)
        self._plans[key] = (q.pos, kv.pos, plan)
        if len(self._plans) > 16:
            self._plans.popitem(last=False)
        return plan

    def _table_getter(self, i: int, fn: OffsetFn, plan: GridPlan, q: TokenLayout, kv: TokenLayout):
        """A callable giving layer i's [H, L_y, L_x] table: from the cache while f is constant, else built in the
        forward (so that gradients reach f's parameters)."""
        dev = q.pos.device

        def build() -> torch.Tensor:
            u = plan.ux.to(dev)[None, :].expand(len(plan.uy), -1)
            v = plan.uy.to(dev)[:, None].expand(-1, len(plan.ux))
            return fn(u, v)

        if not self.constant():
            return build
        ends = (plan.ux[0].item(), plan.ux[-1].item(), plan.uy[0].item(), plan.uy[-1].item())  # the offsets' range
        key = (self.table_key(i), self._layout_key(q), self._layout_key(kv), ends)

        def cached() -> torch.Tensor:
            hit = self._tables.get(key)
            if hit is None:
                with torch.inference_mode(False), torch.no_grad():
                    hit = build()
                self._tables[key] = hit
                if len(self._tables) > 64:
                    self._tables.popitem(last=False)
            return hit

        return cached
