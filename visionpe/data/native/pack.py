"""Online first-fit-decreasing packing of images into the rows of a batch, with a bounded buffer (NaViT-style).

Images arrive one by one as (key, tokens). The packer holds at most `buffer` of them; once it holds enough tokens
to fill a batch twice over (or the buffer is full) it fills one batch of `rows` rows of `capacity` tokens: the
images it holds, largest first (ties in arrival order), each into the first row with room. Images that fit no row
wait for the next batch. Everything is a function of the arrival order, so a seeded order packs the same way
every time; an image larger than a row is a one-line error.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator

__all__ = ["OnlinePacker", "pack"]

FILL = 2  # a batch is filled once the buffer holds this many batches' worth of tokens (or is full)


class OnlinePacker:
    """push((key, tokens)) -> the batches completed by it (lists of rows, each a list of keys); flush() -> the
    rest. `peak` is the most images held at once (never above `buffer`)."""

    def __init__(self, capacity: int, rows: int, buffer: int):
        if capacity < 1 or rows < 1 or buffer < 1:
            raise ValueError(f"capacity, rows and buffer must be positive, got {capacity}, {rows}, {buffer}")
        self.capacity, self.rows, self.buffer = int(capacity), int(rows), int(buffer)
        self.held: list[tuple[int, int, Hashable]] = []  # (tokens, arrival, key)
        self.arrived, self.peak = 0, 0

    def _tokens(self) -> int:
        return sum(t for t, _, _ in self.held)

    def push(self, key: Hashable, tokens: int) -> list[list[list]]:
        if tokens > self.capacity:
            raise ValueError(
                f"image {key!r} needs {tokens} tokens but a row holds {self.capacity}; raise data.native.row_tokens "
                f"or lower its token budget (data.native.max_tokens / seq_lens)"
            )
        if tokens < 1:
            raise ValueError(f"image {key!r} has {tokens} tokens; every image needs at least one patch")
        self.held.append((int(tokens), self.arrived, key))
        self.arrived += 1
        self.peak = max(self.peak, len(self.held))
        full = len(self.held) >= self.buffer or self._tokens() >= FILL * self.rows * self.capacity
        return [self._fill()] if full else []

    def flush(self) -> list[list[list]]:
        """The batches that empty the buffer (the last ones are only partly full)."""
        out = []
        while self.held:
            out.append(self._fill())
        return out

    def _fill(self) -> list[list]:
        rows: list[list] = [[] for _ in range(self.rows)]
        free = [self.capacity] * self.rows
        waiting = []
        for item in sorted(self.held, key=lambda t: (-t[0], t[1])):
            r = next((i for i, f in enumerate(free) if f >= item[0]), None)
            if r is None:
                waiting.append(item)
                continue
            rows[r].append(item[2])
            free[r] -= item[0]
        self.held = sorted(waiting, key=lambda t: t[1])
        return rows


def pack(items: Iterable[tuple[Hashable, int]], capacity: int, rows: int, buffer: int) -> Iterator[list[list]]:
    """Every batch of a finite stream of (key, tokens), the partly full last ones included."""
    packer = OnlinePacker(capacity, rows, buffer)
    for key, tokens in items:
        yield from packer.push(key, tokens)
    yield from packer.flush()
