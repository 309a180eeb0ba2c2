"""The CUDA caching allocator, replayed: a stream of block allocations and frees in, the segments it would
reserve out, under the policy of PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` (read for torch 2.4-2.11;
the policy below has not changed across that series, only how it is configured).

The rules, each decided here as the allocator decides it (tests/test_allocator.py plants one case per rule):
- A request is rounded up to 512 B, or with ``roundup_power2_divisions`` to the next of N equal divisions
  between two powers of two (only above 512 × N bytes).
- Requests of at most 1 MiB go to the small pool, larger ones to the large pool; a pool keeps its free blocks
  per stream (a stream's free block never serves another stream: FSDP's all-gather stream has its own cache).
- A request is served by the free block of its pool and stream that is the smallest at least as big (best fit;
  the lowest address among equals). A block of ``max_split_size`` or more (an oversize block) never serves a
  request under it, and serves one at or above it only if it exceeds it by less than
  ``max_non_split_rounding_mb`` (20 MiB by default).
- With no such block, a new segment is allocated (cudaMalloc): 2 MiB for a small request, 20 MiB for one of
  1-10 MiB, else the request rounded up to 2 MiB.
- The block found is split when what remains is worth keeping: in the small pool (or with expandable
  segments) when 512 B or more remain; in the large pool when the request is under ``max_split_size`` and more
  than 1 MiB remains. The remainder goes back to the pool.
- A freed block merges with its free neighbours inside its segment.
- When cudaMalloc fails (the card is full): with a ``max_split_size`` set, oversize cached blocks are released
  (the smallest one large enough, else the largest ones until enough) and the allocation retried; then every
  cached block that is a whole segment (not split) is released in both pools and it is retried once more;
  failing that, out of memory.
- ``expandable_segments:True``: one segment per pool and stream whose address space grows by mapping pages
  (2 MiB in the small pool, 20 MiB in the large) at the lowest address where the request fits; a request is
  mapped for its own size, not for a segment's; splitting keeps any 512 B; releasing unmaps the free pages.
- ``garbage_collection_threshold`` acts only under a per-process memory fraction (torch's rule): before a new
  segment, cached whole large segments older than the average are released until usage is under the threshold.

What this module does not know: where the stream comes from (probe/trace.py), the CUDA context and NCCL's
buffers (outside the allocator: sheet/gpu_memory.py).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Iterable

from pilotrun.probe.alloc_conf import DEFAULTS, UNLIMITED, Settings

KiB, MiB = 2**10, 2**20
MIN_BLOCK = 512                 # kMinBlockSize: every request is rounded to at least this
SMALL_SIZE = 1 * MiB            # kSmallSize: the largest small request
SMALL_BUFFER = 2 * MiB          # kSmallBuffer: a small pool's segment (and its expandable page)
LARGE_BUFFER = 20 * MiB         # kLargeBuffer: the segment of a 1-10 MiB request (and a large expandable page)
MIN_LARGE_ALLOC = 10 * MiB      # kMinLargeAlloc: from here a request gets a segment of its own
ROUND_LARGE = 2 * MiB           # kRoundLarge: an own segment is rounded up to this
POLICY = "CUDACachingAllocator, torch 2.4-2.11"

def round_size(size: int, settings: Settings = DEFAULTS) -> int:
    """A request's size as the allocator books it."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    div = settings.divisions(size)
    if div > 1 and size > MIN_BLOCK * div:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor // div
        if step == 0:
            return floor << 1
        return -(-size // step) * step
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request that no cached block serves."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class OutOfMemory(Exception):
    """The replay's CUDA out of memory: the request, and what the allocator held when it failed."""

    def __init__(self, requested: int, allocated: int, reserved: int, capacity: int):
        self.requested, self.allocated, self.reserved, self.capacity = requested, allocated, reserved, capacity
        self.phase, self.phases = None, []  # set by ``replay``
        super().__init__(f"out of memory: tried to allocate {requested / MiB:.1f} MiB with {allocated / MiB:.1f} MiB "
                         f"allocated and {reserved / MiB:.1f} MiB reserved of {capacity / MiB:.1f} MiB")


class Block:
    __slots__ = ("stream", "size", "addr", "small", "prev", "next", "allocated", "mapped", "segment", "gc_base",
                 "requested", "pooled")

    def __init__(self, stream: int, size: int, addr: int, small: bool, segment):
        self.stream, self.size, self.addr, self.small, self.segment = stream, size, addr, small, segment
        self.prev = self.next = None
        self.allocated, self.mapped = False, True
        self.gc_base = self.requested = 0
        self.pooled = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.addr)


class _Segment:
    """One cudaMalloc, or one expandable segment's address space (``expandable``)."""

    __slots__ = ("addr", "size", "expandable", "page")

    def __init__(self, addr: int, size: int, expandable: bool = False, page: int = 0):
        self.addr, self.size, self.expandable, self.page = addr, size, expandable, page


class _Pool:
    """The free blocks of one pool, ordered by (stream, size, address) like torch's BlockComparatorSize, and its
    expandable segments' unmapped ranges by (stream, address)."""

    def __init__(self, small: bool):
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.by_key: dict[tuple[int, int, int], Block] = {}
        self.unmapped: list[tuple[int, int]] = []
        self.unmapped_at: dict[tuple[int, int], Block] = {}
        self.calls = 0  # get_free_block calls (the garbage collector's clock)

    def insert(self, b: Block) -> None:
        k = b.pooled = (b.stream, b.size, b.addr)  # its key while it is in the pool (it is not changed there)
        bisect.insort(self.keys, k)
        self.by_key[k] = b
        b.gc_base = self.calls

    def remove(self, b: Block) -> None:
        k = b.pooled
        del self.keys[bisect.bisect_left(self.keys, k)]
        del self.by_key[k]

    def insert_unmapped(self, b: Block) -> None:
        k = (b.stream, b.addr)
        bisect.insort(self.unmapped, k)
        self.unmapped_at[k] = b

    def remove_unmapped(self, b: Block) -> None:
        k = (b.stream, b.addr)
        del self.unmapped[bisect.bisect_left(self.unmapped, k)]
        del self.unmapped_at[k]



def _split(block: Block, size: int) -> Block:
    """``block`` cut to its first ``size`` bytes; the rest, a free block after it in the same segment, returned."""
    rest = Block(block.stream, block.size - size, block.addr + size, block.small, block.segment)
    rest.prev, rest.next = block, block.next
    if block.next is not None:
        block.next.prev = rest
    block.next = rest
    block.size = size
    return rest


class CachingAllocator:
    """One device's caching allocator. ``capacity``: the bytes cudaMalloc can hand out (the card less what lives
    outside the allocator), None for a card that never fills; ``total``: the card's memory (expandable segments'
    address space and a memory fraction are sized from it), default ``capacity``."""

    def __init__(self, settings: Settings = DEFAULTS, capacity: int | None = None, total: int | None = None):
        self.settings = settings
        self.capacity = capacity
        self.total = total or capacity or 2**47
        self.allowed = None if settings.memory_fraction is None else int(settings.memory_fraction * self.total)
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.most_reserved = 0  # the most ever reserved (never reset): a capacity at or above it is never reached
        self.retries = self.segments_allocated = self.segments_released = 0
        self.grown: list[int] = []  # each segment allocated (or range mapped), in order: what torch's trace records
        self._next_addr = 1 << 40
        self.expandable: list[_Segment] = []
        self.live: dict[int, Block] = {}
        self._plain_rounding = not any(settings.roundup_power2_divisions)  # round_size's 512 B steps only

    # --- what the counters say -----------------------------------------------------------------------------
    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def _reserve(self, n: int) -> None:
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.most_reserved = max(self.most_reserved, self.reserved)

    def _new_addr(self, size: int, align: int = ROUND_LARGE) -> int:
        addr = self._next_addr
        self._next_addr += -(-size // align) * align + align  # a gap: segments are never neighbours
        return addr

    # --- malloc ----------------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        s = self.settings
        nbytes = int(nbytes)
        if self._plain_rounding:  # round_size without divisions, inline (the replay's hottest line)
            size = MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        else:
            size = round_size(nbytes, s)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        block = self._free_block(pool, stream, size)
        if block is None:
            if self.allowed is not None and s.garbage_collection_threshold > 0:
                self._collect_garbage()
            block = self._new_segment(pool, stream, size)
            if block is None and self._release_oversize(pool, stream, size):
                block = self._new_segment(pool, stream, size)
            if block is None:
                self._release_cached()
                self.retries += 1
                block = self._new_segment(pool, stream, size)
            if block is None:
                raise OutOfMemory(size, self.allocated, self.reserved, self._limit())
        if self._should_split(block, size):
            pool.insert(_split(block, size))
        block.allocated = True
        block.requested = nbytes
        self.live[id(block)] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def _limit(self) -> int:
        limits = [x for x in (self.capacity, self.allowed) if x is not None]
        return min(limits) if limits else 2**63

    def _free_block(self, pool: _Pool, stream: int, size: int) -> Block | None:
        s = self.settings
        if self.allowed is not None and s.garbage_collection_threshold > 0:
            pool.calls += 1
        at = bisect.bisect_left(pool.keys, (stream, size, -1))
        if at == len(pool.keys) or pool.keys[at][0] != stream:
            return None
        b = pool.by_key[pool.keys[at]]
        if b.segment.expandable:
            if s.expandable_segments:  # best fit counts what an expandable block can still grow into
                def grows(x: Block) -> int:
                    return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
                while b.segment.expandable and at + 1 < len(pool.keys) and pool.keys[at + 1][0] == stream:
                    nxt = pool.by_key[pool.keys[at + 1]]
                    if grows(nxt) >= grows(b):
                        break
                    at, b = at + 1, nxt
            else:  # turned off since: only blocks of ordinary segments
                at += 1
                while at < len(pool.keys) and pool.keys[at][0] == stream and pool.by_key[pool.keys[at]].segment.expandable:
                    at += 1
                if at == len(pool.keys) or pool.keys[at][0] != stream:
                    return None
                b = pool.by_key[pool.keys[at]]
        if size < s.max_split_size <= b.size:
            return None  # an oversize block never serves a request under max_split_size
        if size >= s.max_split_size and b.size >= size + s.max_non_split_rounding:
            return None  # nor one it exceeds by max_non_split_rounding or more
        pool.remove(b)
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.small or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK
        return size < self.settings.max_split_size and remaining > SMALL_SIZE

    def _fits(self, n: int) -> bool:
        if self.allowed is not None and self.reserved + n > self.allowed:
            return False
        return self.capacity is None or self.reserved + n <= self.capacity

    def _new_segment(self, pool: _Pool, stream: int, size: int) -> Block | None:
        if self.settings.expandable_segments:
            return self._expand(pool, stream, size)
        n = allocation_size(size)
        if not self._fits(n):
            return None
        seg = _Segment(self._new_addr(n), n)
        self._reserve(n)
        self.segments_allocated += 1
        self.grown.append(n)
        return Block(stream, n, seg.addr, pool.small, seg)

    # --- releasing cached segments ----------------------------------------------------------------------------
    def _release(self, pool: _Pool, b: Block) -> None:
        pool.remove(b)
        self.reserved -= b.size
        self.segments_released += 1

    def _release_oversize(self, pool: _Pool, stream: int, size: int) -> bool:
        """Release cached oversize blocks, enough for the request: the smallest that is, else the largest ones."""
        s = self.settings
        if s.max_split_size == UNLIMITED:
            return False
        want = max(size, s.max_split_size)
        at = bisect.bisect_left(pool.keys, (stream, want, -1))
        if at < len(pool.keys) and pool.keys[at][0] == stream:
            self._release(pool, pool.by_key[pool.keys[at]])
            return True
        released = 0
        at -= 1
        while released < want and at >= 0 and pool.keys[at][0] == stream and pool.keys[at][1] >= s.max_split_size:
            b = pool.by_key[pool.keys[at]]
            released += b.size
            self._release(pool, b)
            at -= 1
        return released >= want

    def _release_cached(self) -> None:
        """Every cached block that is a whole segment goes back to the card (both pools); expandable segments
        unmap their free pages."""
        for pool in self.pools.values():
            for k in list(pool.keys):
                b = pool.by_key.get(k)
                if b is None:
                    continue
                if b.segment.expandable:
                    self._unmap(pool, b)
                elif not b.is_split():
                    self._release(pool, b)

    def empty_cache(self) -> None:
        self._release_cached()

    def _collect_garbage(self) -> None:
        threshold = int(self.settings.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        pool = self.pools[False]
        whole = [pool.by_key[k] for k in pool.keys if not pool.by_key[k].is_split() and not pool.by_key[k].segment.expandable]
        age = sum(pool.calls - b.gc_base for b in whole)
        count = len(whole)
        freed = True
        while reclaimed < target and freed and count:
            threshold_age = age / count
            freed = False
            for b in [pool.by_key[k] for k in list(pool.keys)]:
                if not b.is_split() and not b.segment.expandable and pool.calls - b.gc_base >= threshold_age:
                    freed = True
                    reclaimed += b.size
                    age -= pool.calls - b.gc_base
                    count -= 1
                    self._release(pool, b)

    # --- expandable segments ----------------------------------------------------------------------------------
    def _expand(self, pool: _Pool, stream: int, size: int) -> Block | None:
        c = self._expandable_candidate(pool, stream, size)
        if not c.mapped:
            c = self._map(pool, c, min(c.size, size))
            if c is None:
                return None
        while c.size < size:
            nxt = c.next
            c2 = self._map(pool, nxt, min(size - c.size, nxt.size))
            if c2 is None:
                return None
            c = c2
        pool.remove(c)
        return c

    def _expandable_candidate(self, pool: _Pool, stream: int, size: int) -> Block:
        """The lowest address in this stream's expandable segments where ``size`` fits in free and unmapped
        space; a new segment (address space for 1 1/8 of the card) when none has room."""
        def free(x):
            return x is not None and not x.allocated

        at = bisect.bisect_left(pool.unmapped, (stream, -1))
        while at < len(pool.unmapped) and pool.unmapped[at][0] == stream:
            c = pool.unmapped_at[pool.unmapped[at]]
            if free(c.prev):
                c = c.prev
            room, x = 0, c
            while room < size and free(x):
                room += x.size
                x = x.next
            if room >= size:
                return c
            at += 1
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        space = -(-(self.total + self.total // 8) // page) * page
        seg = _Segment(self._new_addr(space, page), space, expandable=True, page=page)
        self.expandable.append(seg)
        c = Block(stream, space, seg.addr, pool.small, seg)
        c.mapped = False
        pool.insert_unmapped(c)
        return c

    def _map(self, pool: _Pool, b: Block, size: int) -> Block | None:
        """Map pages for ``size`` bytes at the start of the unmapped ``b``; the mapped block, merged with a free
        mapped neighbour, is then in the pool (None when the card is full)."""
        page = b.segment.page
        n = min(-(-size // page) * page, b.size)
        if not self._fits(n):
            return None
        pool.remove_unmapped(b)
        b.mapped = True
        if n < b.size:
            rest = _split(b, n)
            rest.mapped = False
            pool.insert_unmapped(rest)
        b = self._merge_free_neighbours(pool, b)
        pool.insert(b)
        self._reserve(n)
        self.segments_allocated += 1
        self.grown.append(n)
        return b

    def _unmap(self, pool: _Pool, b: Block) -> None:
        """Unmap the whole pages inside the free block ``b``."""
        page, base = b.segment.page, b.segment.addr
        start = base + -(-(b.addr - base) // page) * page
        end = base + (b.addr + b.size - base) // page * page
        if end <= start:
            return
        pool.remove(b)
        if start > b.addr:
            before = Block(b.stream, start - b.addr, b.addr, b.small, b.segment)
            before.prev, before.next = b.prev, b
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        if b.addr + b.size > end:
            after = Block(b.stream, b.addr + b.size - end, end, b.small, b.segment)
            after.prev, after.next = b, b.next
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.addr, b.size, b.mapped = start, end - start, False
        self.reserved -= b.size
        self.segments_released += 1
        for other in (b.prev, b.next):
            if other is not None and not other.allocated and not other.mapped:
                pool.remove_unmapped(other)
                self._absorb(b, other)
        pool.insert_unmapped(b)

    # --- free ------------------------------------------------------------------------------------------------
    def free(self, block: Block) -> None:
        if not block.allocated:
            raise ValueError("block freed twice")
        block.allocated = False
        del self.live[id(block)]
        self.allocated -= block.size
        pool = self.pools[block.small]
        block = self._merge_free_neighbours(pool, block)
        pool.insert(block)

    def _merge_free_neighbours(self, pool: _Pool, b: Block) -> Block:
        for other in (b.prev, b.next):
            if other is not None and not other.allocated and other.mapped == b.mapped:
                if other.mapped:
                    pool.remove(other)
                else:
                    pool.remove_unmapped(other)
                self._absorb(b, other)
        return b

    @staticmethod
    def _absorb(b: Block, other: Block) -> None:
        if other is b.prev:
            b.addr = other.addr
            b.prev = other.prev
            if b.prev is not None:
                b.prev.next = b
        else:
            b.next = other.next
            if b.next is not None:
                b.next.prev = b
        b.size += other.size

    # --- inspection --------------------------------------------------------------------------------------------
    def segments(self) -> list[dict]:
        """Each segment (an expandable one: each mapped range) with its blocks in address order: what torch's
        snapshot lists."""
        blocks = [b for pool in self.pools.values() for b in pool.by_key.values()] + list(self.live.values())
        out = []
        for head in blocks:
            if head.prev is not None and head.prev.mapped:
                continue
            parts, x = [], head
            while x is not None and x.mapped:
                parts.append({"size": x.size, "allocated": x.allocated})
                x = x.next
            out.append({"address": head.addr, "stream": head.stream, "small": head.small,
                        "expandable": head.segment.expandable, "total_size": sum(p["size"] for p in parts),
                        "blocks": parts})
        return sorted(out, key=lambda s: s["address"])


# --- replaying a stream -------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PhasePeaks:
    name: str
    start_allocated: int
    peak_allocated: int
    peak_reserved: int
    end_allocated: int
    end_reserved: int


def replay(events: Iterable[tuple], settings: Settings = DEFAULTS, capacity: int | None = None,
           total: int | None = None) -> tuple[list[PhasePeaks], CachingAllocator]:
    """Replay ``events`` in order: ("+", key, nbytes, stream) allocates, ("-", key) frees the block allocated under
    ``key``, ("phase", name) starts a phase (peaks reset, as the pilot's probe resets them) and ("end", name) ends
    it, ("empty_cache",) empties the cache. Returns each phase's counters and the allocator; raises
    ``OutOfMemory`` when the card cannot hold the stream."""
    a = CachingAllocator(settings, capacity, total)
    live: dict = {}
    phases: list[PhasePeaks] = []
    start, name = 0, None
    for e in events:
        kind = e[0]
        if kind == "+":
            try:
                live[e[1]] = a.malloc(e[2], e[3] if len(e) > 3 else 0)
            except OutOfMemory as oom:
                oom.phase, oom.phases = name, phases  # where it ran out, and the phases it completed
                raise
        elif kind == "-":
            a.free(live.pop(e[1]))
        elif kind == "phase":
            a.reset_peaks()
            start, name = a.allocated, e[1]
        elif kind == "end":
            phases.append(PhasePeaks(e[1], start, a.peak_allocated, a.peak_reserved, a.allocated, a.reserved))
        elif kind == "empty_cache":
            a.empty_cache()
        else:
            raise ValueError(f"unknown event {e!r}")
    return phases, a


def largest_fitting(fits, cap: int) -> int:
    """The largest n in [1, cap] such that every size from 1 to n fits (0 when 1 does not): the answer a run that
    grows its batch, or meets shorter batches later, can rely on; ``fits(n)`` need not be monotonic."""
    n = 0
    while n < cap and fits(n + 1):
        n += 1
    return n
