"""iRPE bucket ids of every (query, key) pair, handed out a block of query rows at a time.

Two forms, both giving the table rows of `IRPE._ids` (one id tensor per table part; two for the cross mapping):
- `GridBuckets`: the product and cross mappings on raster grids are separable, b(i, j) = row part (y_i, y_j) and
  column part (x_i, x_j), so only two small per-axis tables are kept ([H_q, H_k] and [W_q, W_k]) and the ids of a
  block are assembled on the fly. For the product mapping the contextual lookup lut[i, b(i, j)] and its adjoint
  (probabilities summed per bucket) are two small batched matmuls with one-hot axis matrices, exact in fp32
  (one product by 1, the rest by 0) and several times faster than a gather over [rows, M]. In eager mode on the
  CPU the row part is cheaper still (the `*_banded` / `*_transposed` forms): a run of consecutive key grid rows with
  one row bucket is one contiguous range of raster keys, within which the bucket depends on the columns alone, so
  each run is one broadcast copy (or sum) of a [rows, W_k] column lookup. iRPE's q term, whose table is read by the
  key, is copied the same way from a per-layer table laid out key last, so its block comes out query-major, without
  a transposed gather.
- `FullBuckets`: every other case (euclidean / quantization, non-grid layouts, small grids): the whole [N, M] id grid,
  stored in the smallest integer type that holds the bucket count (uint8 for iRPE's 50 buckets).
Both keep memory O(N + M) or O(N x M) bytes rather than O(N x M) int64 words, and give `full()` for the reference.
"""

from __future__ import annotations

import torch

__all__ = ["GridBuckets", "FullBuckets", "compact_int_dtype"]


def compact_int_dtype(upper: int) -> torch.dtype:
    """The smallest integer dtype that holds 0..upper."""
    if upper < 256:
        return torch.uint8
    if upper < 2**15:
        return torch.int16
    return torch.int32 if upper < 2**31 else torch.int64


class FullBuckets:
    """The whole id grid [Pq + N, Pk + M] per table part, in a compact integer dtype."""

    def __init__(self, parts: list[torch.Tensor], rows: int):
        dtype = compact_int_dtype(rows - 1)
        self.parts = [p.to(dtype) for p in parts]
        self.shape = tuple(parts[0].shape)

    def full(self) -> list[torch.Tensor]:
        return [p.long() for p in self.parts]

    def block(self, start: int, stop: int) -> list[torch.Tensor]:
        """Ids of query rows [start, stop): int64 [rows, Pk + M] per part."""
        return [p[start:stop].long() for p in self.parts]

    def block_t(self, start: int, stop: int) -> list[torch.Tensor]:
        """Ids of key columns [start, stop): int64 [Pq + N, cols] per part."""
        return [p[:, start:stop].long() for p in self.parts]


class GridBuckets:
    """Separable ids of the product / cross mapping between two raster grids (with optional prefix tokens).

    axis_y [H_q, H_k] and axis_x [W_q, W_k] (int64) hold each axis's bucket (offset by B); `product` says whether the
    full id is axis_y * width_x + axis_x (one part) or the two are separate parts (cross, the column part shifted by
    col_start). extra: the prefix bucket of each part (None without prefix tokens)."""

    def __init__(
        self,
        axis_y: torch.Tensor,
        axis_x: torch.Tensor,
        buckets: tuple[int, int],
        product: bool,
        prefix: tuple[int, int],
        extra: bool,
    ):
        self.axis_y, self.axis_x = axis_y, axis_x
        self.ny, self.nx = buckets  # buckets per axis: 2B + 1
        self.product = product
        self.pq, self.pk = prefix
        (self.hq, self.hk), (self.wq, self.wk) = axis_y.shape, axis_x.shape
        self.shape = (self.pq + self.hq * self.wq, self.pk + self.hk * self.wk)
        if product:
            self.extra_ids = [self.ny * self.nx] if extra else None
        else:
            self.col_start = self.ny + int(extra)
            self.extra_ids = [self.ny, self.col_start + self.nx] if extra else None
        self._runs: dict[bool, list[list[tuple[int, int, int]]]] = {}

    # ------------------------------------------------------------------------------------------------ ids

    def _grid_ids(self, qs: slice, ks: slice) -> list[torch.Tensor]:
        """Ids of grid queries qs and grid keys ks (indices into the raster grids): [len(qs), len(ks)] per part."""
        dev = self.axis_y.device
        qi = torch.arange(qs.start, qs.stop, device=dev)
        ki = torch.arange(ks.start, ks.stop, device=dev)
        ys = self.axis_y[qi // self.wq][:, ki // self.wk]  # [rows, cols]
        xs = self.axis_x[qi % self.wq][:, ki % self.wk]
        if self.product:
            return [ys * self.nx + xs]
        return [ys, xs + self.col_start]

    def _pairs(self, qs: slice, ks: slice) -> list[torch.Tensor]:
        """Ids of token rows qs and token columns ks (prefix tokens included, first)."""
        q0, q1, k0, k1 = qs.start, qs.stop, ks.start, ks.stop
        gq = slice(max(q0, self.pq) - self.pq, max(q1, self.pq) - self.pq)
        gk = slice(max(k0, self.pk) - self.pk, max(k1, self.pk) - self.pk)
        grid = self._grid_ids(gq, gk)
        if self.extra_ids is None or (q0 >= self.pq and k0 >= self.pk):
            return grid
        out = []
        for part, extra in zip(grid, self.extra_ids):
            full = part.new_full((q1 - q0, k1 - k0), extra)
            full[q1 - q0 - part.shape[0] :, k1 - k0 - part.shape[1] :] = part
            out.append(full)
        return out

    def full(self) -> list[torch.Tensor]:
        return self._pairs(slice(0, self.shape[0]), slice(0, self.shape[1]))

    def block(self, start: int, stop: int) -> list[torch.Tensor]:
        return self._pairs(slice(start, stop), slice(0, self.shape[1]))

    def block_t(self, start: int, stop: int) -> list[torch.Tensor]:
        return self._pairs(slice(0, self.shape[0]), slice(start, stop))

    # ------------------------------------------------------------------------------------------------ product lookup

    def _one_hots(self, start: int, stop: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """For grid query rows [start, stop): row one-hots [rows, H_k, ny] and column one-hots [rows, nx, W_k]."""
        dev = self.axis_y.device
        qi = torch.arange(start - self.pq, stop - self.pq, device=dev)
        oy = torch.nn.functional.one_hot(self.axis_y[qi // self.wq], self.ny).to(dtype)  # [rows, H_k, ny]
        ox = torch.nn.functional.one_hot(self.axis_x[qi % self.wq], self.nx).to(dtype).transpose(-1, -2)
        return oy, ox  # ox: [rows, nx, W_k]

    def lookup(self, lut: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """out[.., i, j] = lut[.., i, b(i, j)] for query rows [start, stop) and every key (product mapping only).

        lut [.., rows, R] with R = ny * nx (+ 1 prefix bucket, last). The grid part is
        onehot_y[i] @ lut[i].view(ny, nx) @ onehot_x[i]^T (no N x M ids)."""
        rows, lead = stop - start, lut.shape[:-2]
        g0 = min(max(start, self.pq), stop) - start  # first grid query of the block
        oy, ox = self._one_hots(start + g0, stop, lut.dtype)
        grid_lut = lut[..., g0:, : self.ny * self.nx].unflatten(-1, (self.ny, self.nx))  # [.., g, ny, nx]
        grid = ((oy @ grid_lut) @ ox).flatten(-2)  # [.., g, H_k * W_k], contiguous (matmul into a strided view
        # of the output falls back to one small product per matrix: 2x slower at 640 px)
        if self.pk:  # prefix keys first, joined row by row (a copy into [:, pk:] of a wider tensor strides the rows;
            # an expanded, not contiguous, column makes the concatenation 2x slower)
            column = lut[..., g0:, -1:].expand(*lead, rows - g0, self.pk).contiguous()
            grid = torch.cat([column, grid], dim=-1)
        if g0:  # prefix queries (the first block only): every key in the prefix bucket
            grid = torch.cat([lut[..., :g0, -1:].expand(*lead, g0, self.shape[1]), grid], dim=-2)
        return grid

    # ------------------------------------------------------------------------------------------------ banded lookup

    def _row_runs(self, transposed: bool) -> list[list[tuple[int, int, int]]]:
        """Per query grid row y_i, the runs (row bucket a, first, end) of equal row buckets over the key grid rows;
        transposed: per key grid row, over the query grid rows. Raster tokens of a run of grid rows are one
        contiguous range, and within it the bucket depends on the columns alone. Read once (a host sync)."""
        if transposed not in self._runs:
            runs = []
            for row in (self.axis_y.t() if transposed else self.axis_y).tolist():
                ends = [y for y in range(1, len(row)) if row[y] != row[y - 1]] + [len(row)]
                starts = [0] + ends[:-1]
                runs.append([(row[a], a, b) for a, b in zip(starts, ends)])
            self._runs[transposed] = runs
        return self._runs[transposed]

    def runs_pay_off(self, lead: int) -> bool:
        """Whether copying runs beats the one-hot products for `lead` (batch x heads) matrices. Measured on the
        CPU: the runs win wherever the keys have prefix tokens (the one-hot result is then copied once more to join
        the prefix column; ViT-S at 640 px: 2.6 against 9.3 ms per block) or a run's copy is large (>= 32K elements
        on average); without prefix keys and with small copies the per-call cost wins (CvT-13's first stage, 1 head,
        6K elements per copy: 1.05x slower)."""
        return self.pk > 0 or lead * self.wq * self.hk * self.wk >= (1 << 15) * self.ny

    def _grid_rows(self, first: int, stop: int, width: int):
        """(grid row y, block rows [r0, r1), columns [x0, x1) of grid row y) covering grid indices [first, stop)."""
        for y in range(first // width, (stop - 1) // width + 1):
            r0, r1 = max(y * width, first) - first, min((y + 1) * width, stop) - first
            yield y, r0, r1, r0 + first - y * width, r1 + first - y * width

    def lookup_banded(self, lut: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """`lookup` without the row one-hot product: per query row, lut[i].view(ny, nx) @ onehot_x[i]^T ([ny, W_k])
        is copied to each run of key grid rows sharing a row bucket (eager mode: the runs are read on the host)."""
        lead, rows = lut.shape[:-2], stop - start
        out = lut.new_empty(*lead, rows, self.shape[1])
        g0 = min(max(start, self.pq), stop) - start
        if g0:  # prefix queries: every key in the prefix bucket
            out[..., :g0, :] = lut[..., :g0, -1:]
        if g0 == rows:
            return out
        _, ox = self._one_hots(start + g0, stop, lut.dtype)
        per_row = lut[..., g0:, : self.ny * self.nx].unflatten(-1, (self.ny, self.nx)) @ ox  # [.., g, ny, W_k]
        if self.pk:
            out[..., g0:, : self.pk] = lut[..., g0:, -1:]
        keys = out[..., g0:, self.pk :].unflatten(-1, (self.hk, self.wk))  # [.., g, H_k, W_k] view
        runs = self._row_runs(False)
        for y, r0, r1, _, _ in self._grid_rows(start + g0 - self.pq, stop - self.pq, self.wq):
            for a, lo, hi in runs[y]:
                keys[..., r0:r1, lo:hi, :] = per_row[..., r0:r1, a, None, :]
        return out

    def columns_table(self, lut: torch.Tensor) -> torch.Tensor:
        """For `lookup_transposed`: T[.., a, x, i] = lut[.., i, a * nx + axis_x[x_i, x]] for every grid query i
        and key grid column x: lut [.., Pq + N, R] -> [.., ny, W_k, N], gathered one row bucket a at a time into
        this layout (a gather in the natural [N, ny, W_k] layout and a transposed copy would hold two tables)."""
        lead, n = lut.shape[:-2], self.shape[0] - self.pq
        grid = lut[..., self.pq :, : self.ny * self.nx].unflatten(-1, (self.ny, self.nx))  # [.., N, ny, nx]
        qi = torch.arange(n, device=lut.device)
        index = self.axis_x[qi % self.wq].t().expand(*lead, self.wk, n)  # [.., W_k, N]: column bucket of (x, i)
        table = lut.new_empty(*lead, self.ny, self.wk, n)
        for a in range(self.ny):
            table[..., a, :, :] = grid[..., a, :].transpose(-1, -2).gather(-2, index)
        return table

    def lookup_transposed(
        self, table: torch.Tensor, prefix: torch.Tensor | None, start: int, stop: int, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """out[.., j, i] = lut[.., i, b(i, j)] for the key columns j in [start, stop) and every query row i, laid
        out key first: [.., stop - start, Pq + N] (iRPE's q term, whose table is read by the key, for a block of
        attention rows). table: `columns_table(lut)`, whose runs of query grid rows are copied (eager mode);
        prefix: lut[.., -1] (the prefix bucket of every query; None without prefix tokens). into: a tensor of the
        output's shape to add the result to, in place (returned)."""
        lead, cols = table.shape[:-3], stop - start
        out = table.new_empty(*lead, cols, self.shape[0]) if into is None else into

        def put(dst: torch.Tensor, src: torch.Tensor):
            dst.copy_(src) if into is None else dst.add_(src)

        c0 = min(max(start, self.pk), stop) - start
        if c0:  # prefix key columns: every query in the prefix bucket
            put(out[..., :c0, :], prefix[..., None, :])
        if c0 == cols:
            return out
        if self.pq:
            put(out[..., c0:, : self.pq], prefix[..., None, : self.pq])
        queries = out[..., c0:, self.pq :].unflatten(-1, (self.hq, self.wq))  # [.., g, H_q, W_q] view
        runs = self._row_runs(True)
        for y, r0, r1, x0, x1 in self._grid_rows(start + c0 - self.pk, stop - self.pk, self.wk):
            for a, lo, hi in runs[y]:
                part = table[..., a, x0:x1, lo * self.wq : hi * self.wq]
                put(queries[..., r0:r1, lo:hi, :], part.unflatten(-1, (hi - lo, self.wq)))
        return out

    def bucket_sums_banded(self, probs: torch.Tensor, start: int, stop: int, buckets: int) -> torch.Tensor:
        """`bucket_sums` with the row one-hot product replaced by sums over runs of key grid rows sharing a row
        bucket ([.., rows, ny, W_k]), then the column one-hots (eager mode)."""
        rows, lead = stop - start, probs.shape[:-2]
        g0 = min(max(start, self.pq), stop) - start
        out = probs.new_zeros(*lead, rows, buckets)
        if g0 < rows:
            keys = probs[..., g0:, self.pk :].unflatten(-1, (self.hk, self.wk))  # [.., g, H_k, W_k]
            per_row = probs.new_zeros(*lead, rows - g0, self.ny, self.wk)
            runs = self._row_runs(False)
            for y, r0, r1, _, _ in self._grid_rows(start + g0 - self.pq, stop - self.pq, self.wq):
                for a, lo, hi in runs[y]:
                    per_row[..., r0:r1, a, :] += keys[..., r0:r1, lo:hi, :].sum(-2)
            _, ox = self._one_hots(start + g0, stop, probs.dtype)
            out[..., g0:, : self.ny * self.nx] = (per_row @ ox.transpose(-1, -2)).flatten(-2)
            if self.pk:
                out[..., g0:, -1] = probs[..., g0:, : self.pk].sum(-1)
        if g0:
            out[..., :g0, -1] = probs[..., :g0, :].sum(-1)
        return out

    def bucket_sums(self, probs: torch.Tensor, start: int, stop: int, buckets: int) -> torch.Tensor:
        """out[.., i, b] = sum of probs[.., i, j] over the keys j with b(i, j) = b, for query rows [start, stop)
        (product mapping only): the adjoint of `lookup`, onehot_y[i]^T @ probs[i].view(H_k, W_k) @ onehot_x[i]^T on
        the grid keys, and the prefix bucket (last) summed directly. probs [.., rows, Pk + M] -> [.., rows, buckets]."""
        rows, lead = stop - start, probs.shape[:-2]
        g0 = min(max(start, self.pq), stop) - start
        out = probs.new_zeros(*lead, rows, buckets)
        if g0 < rows:
            oy, ox = self._one_hots(start + g0, stop, probs.dtype)
            grid = probs[..., g0:, self.pk :].unflatten(-1, (self.hk, self.wk))  # [.., g, H_k, W_k]
            sums = (oy.transpose(-1, -2) @ grid) @ ox.transpose(-1, -2)  # [.., g, ny, nx]
            out[..., g0:, : self.ny * self.nx] = sums.flatten(-2)
            if self.pk:
                out[..., g0:, -1] = probs[..., g0:, : self.pk].sum(-1)
        if g0:
            out[..., :g0, -1] = probs[..., :g0, :].sum(-1)
        return out
