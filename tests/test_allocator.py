"""The caching allocator's replay (probe/allocator.py), one planted case per rule of torch's
c10/cuda/CUDACachingAllocator.cpp: each test states the rule as that file decides it and builds the smallest
stream where the rule changes what is reserved, so a replay that broke the rule reserves something else."""

from __future__ import annotations

import pytest

from pilotrun.errors import BadInput
from pilotrun.probe.alloc_conf import DEFAULTS, parse_settings, settings_from_env
from pilotrun.probe.allocator import MiB, CachingAllocator, OutOfMemory, allocation_size, replay, round_size

MiB, KiB = 2**20, 2**10


def test_requests_are_rounded_to_512_bytes_and_to_power_of_two_divisions():
    # round_size: under kMinBlockSize (512) → 512; else a multiple of 512
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    # roundup_power2_divisions:4 — between 1 MiB and 2 MiB the steps are 256 KiB; a power of two stays itself
    four = parse_settings("roundup_power2_divisions:4")
    assert round_size(MiB + 1, four) == MiB + 256 * KiB
    assert round_size(2 * MiB, four) == 2 * MiB
    assert round_size(1200, four) == 1536  # not above 512 × 4 bytes: plain 512 rounding
    # the list form sets divisions per power of two (in MiB), '>' for the rest
    per = parse_settings("roundup_power2_divisions:[1:2,>:8]")
    assert round_size(MiB + 1, per) == MiB + MiB // 2
    assert round_size(64 * MiB + 1, per) == 64 * MiB + 8 * MiB


def test_segment_sizes_follow_the_request_class():
    # get_allocation_size: ≤ 1 MiB → 2 MiB; < 10 MiB → 20 MiB; else rounded up to 2 MiB
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB and allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB and allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_two_mib_segments():
    a = CachingAllocator()
    for _ in range(3):
        a.malloc(600 * KiB)
    assert a.reserved == 2 * MiB  # 3 × 600 KiB packed into one small segment
    a.malloc(600 * KiB)
    assert a.reserved == 4 * MiB


def test_mid_requests_share_twenty_mib_segments():
    a = CachingAllocator()
    a.malloc(6 * MiB)
    a.malloc(6 * MiB)
    assert a.reserved == 20 * MiB
    a.malloc(9 * MiB)  # 8 MiB left in the segment: a new one
    assert a.reserved == 40 * MiB


def test_a_large_remainder_of_one_mib_is_not_split_off():
    # should_split (large pool): remaining > kSmallSize; an 11 MiB request gets a 12 MiB segment whole
    a = CachingAllocator()
    b = a.malloc(11 * MiB)
    assert b.size == 12 * MiB and a.allocated == 12 * MiB and a.reserved == 12 * MiB


def test_a_cached_block_is_split_and_the_best_fit_is_chosen():
    a = CachingAllocator()
    big, small = a.malloc(30 * MiB), a.malloc(14 * MiB)
    a.free(big)
    a.free(small)
    a.malloc(12 * MiB)  # best fit: the 14 MiB block (split: 2 MiB > 1 MiB remains), not the 30 MiB one
    a.malloc(28 * MiB)  # so the 30 MiB one is still whole for this
    assert a.reserved == 44 * MiB and a.segments_allocated == 2


def test_a_free_block_never_serves_another_stream():
    a = CachingAllocator()
    a.free(a.malloc(30 * MiB, stream=1))
    a.malloc(30 * MiB, stream=0)
    assert a.reserved == 60 * MiB
    a.malloc(30 * MiB, stream=1)
    assert a.reserved == 60 * MiB


def test_freed_neighbours_merge_inside_their_segment():
    a = CachingAllocator()
    x, y, z = a.malloc(6 * MiB), a.malloc(6 * MiB), a.malloc(6 * MiB)
    a.free(x)
    a.free(y)  # x and y merge: 12 MiB free at the segment's start (z still holds the rest)
    a.malloc(11 * MiB)
    assert a.reserved == 20 * MiB
    assert [s["total_size"] for s in a.segments()] == [20 * MiB]
    del z


def test_an_oversize_block_does_not_serve_a_smaller_request():
    s = parse_settings("max_split_size_mb:100")
    a = CachingAllocator(s)
    a.free(a.malloc(150 * MiB))
    a.malloc(30 * MiB)  # under max_split_size: the cached 150 MiB block may not serve it
    assert a.reserved == 180 * MiB
    # a request at or over max_split_size takes an oversize block only within max_non_split_rounding (20 MiB)
    b = CachingAllocator(s)
    b.free(b.malloc(150 * MiB))
    b.malloc(120 * MiB)
    assert b.reserved == 270 * MiB
    c = CachingAllocator(s)
    c.free(c.malloc(150 * MiB))
    blk = c.malloc(140 * MiB)
    assert c.reserved == 150 * MiB and blk.size == 150 * MiB  # served whole: an oversize block is never split
    # without max_split_size the same 30 MiB request splits the cached block
    d = CachingAllocator()
    d.free(d.malloc(150 * MiB))
    d.malloc(30 * MiB)
    assert d.reserved == 150 * MiB


def test_a_failed_cudamalloc_releases_whole_cached_segments_and_retries():
    a = CachingAllocator(capacity=100 * MiB)
    a.free(a.malloc(60 * MiB))
    a.malloc(70 * MiB)  # 60 + 70 > 100: the cached 60 MiB segment is released, then it fits
    assert a.reserved == 70 * MiB and a.retries == 1
    # a cached block that is part of a split segment cannot be released: out of memory
    b = CachingAllocator(capacity=100 * MiB)
    b.free(b.malloc(60 * MiB))
    held = b.malloc(20 * MiB)  # served from the cached 60 MiB segment, the other 40 MiB split off and cached
    assert b.reserved == 60 * MiB
    with pytest.raises(OutOfMemory) as e:
        b.malloc(70 * MiB)
    assert e.value.requested == 70 * MiB and e.value.capacity == 100 * MiB
    del held


def test_with_max_split_size_oversize_blocks_are_released_before_everything():
    a = CachingAllocator(parse_settings("max_split_size_mb:100"), capacity=170 * MiB)
    a.free(a.malloc(150 * MiB))
    a.malloc(30 * MiB)  # the oversize 150 MiB block cannot serve it and is in the way: released
    assert a.reserved == 30 * MiB and a.retries == 0  # released on the first pass, not the retry of everything


def test_expandable_segments_grow_instead_of_adding_segments():
    # batch N then N + 1: a 30 MiB then a 32 MiB request, the first freed
    plain = CachingAllocator()
    plain.free(plain.malloc(30 * MiB))
    plain.malloc(32 * MiB)
    assert plain.reserved == 62 * MiB
    grow = CachingAllocator(parse_settings("expandable_segments:True"), total=80 * 2**30)
    grow.free(grow.malloc(30 * MiB))  # mapped in 20 MiB pages: 40 MiB
    assert grow.reserved == 40 * MiB
    grow.malloc(32 * MiB)  # fits in the mapped 40 MiB
    assert grow.reserved == 40 * MiB
    grow.malloc(30 * MiB)  # 8 MiB free at the end + 22 MiB more: two pages mapped after it
    assert grow.reserved == 80 * MiB and len(grow.segments()) == 1


def test_expandable_segments_unmap_free_pages_when_the_card_is_full():
    a = CachingAllocator(parse_settings("expandable_segments:True"), capacity=100 * MiB, total=100 * MiB)
    x = a.malloc(60 * MiB)
    a.malloc(20 * MiB)
    a.free(x)  # 60 MiB free at the segment's start
    a.malloc(70 * MiB, stream=1)  # another stream: its own segment; the free pages are unmapped for it
    assert a.reserved == 20 * MiB + 80 * MiB  # stream 0 keeps its 20 MiB; 70 MiB mapped in 20 MiB pages


def test_garbage_collection_needs_a_memory_fraction():
    def run(text):
        a = CachingAllocator(parse_settings(text), total=200 * MiB)
        a.free(a.malloc(40 * MiB))
        a.malloc(50 * MiB)
        return a.reserved
    assert run("garbage_collection_threshold:0.3") == 90 * MiB  # no fraction: the threshold does nothing
    assert run("garbage_collection_threshold:0.3,per_process_memory_fraction:0.5") == 50 * MiB
    assert run("per_process_memory_fraction:0.5") == 90 * MiB


def test_the_replay_reports_each_phase_as_the_probe_resets_its_peaks():
    events = [("phase", "a"), ("+", 1, 30 * MiB), ("+", 2, 5 * MiB), ("-", 2), ("end", "a"),
              ("phase", "b"), ("-", 1), ("+", 3, 12 * MiB), ("empty_cache",), ("end", "b")]
    phases, a = replay(events)
    assert [(p.name, p.peak_allocated, p.peak_reserved) for p in phases] == [
        ("a", 35 * MiB + 0, 50 * MiB), ("b", 30 * MiB, 50 * MiB)]
    assert phases[1].start_allocated == 30 * MiB and phases[1].end_reserved == 20 * MiB  # 12 MiB best fits the 20 MiB segment (split); the 30 MiB one released
    assert a.allocated == 12 * MiB


@pytest.mark.parametrize("text,word", [
    ("max_split_size_mb:10", "at least 20"), ("expandable_segments:yes", "True or False"),
    ("roundup_power2_divisions:3", "power of two"), ("garbage_collection_threshold:1.5", "(0.0, 1.0)"),
    ("expandable_segment:True", "unknown allocator key"), ("backend:cudaMallocAsync", "replaces the caching"),
    ("max_split_size_mb", "needs ':'"), ("roundup_power2_divisions:[256:1", "closing"),
])
def test_settings_torch_refuses_are_refused_naming_the_key(text, word):
    with pytest.raises(BadInput) as e:
        parse_settings(text, where="PYTORCH_CUDA_ALLOC_CONF")
    assert word in str(e.value) and e.value.where == "PYTORCH_CUDA_ALLOC_CONF"


def test_settings_come_from_the_launch_environment():
    assert settings_from_env({}) == (DEFAULTS, None)
    s, name = settings_from_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, max_split_size_mb:512"})
    assert name == "PYTORCH_CUDA_ALLOC_CONF" and s.expandable_segments and s.max_split_size == 512 * MiB
    s, name = settings_from_env({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64",
                                 "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert name == "PYTORCH_ALLOC_CONF" and not s.expandable_segments  # the first set wins, as in torch
    s = parse_settings("release_lock_on_cudamalloc:True,backend:native")  # accepted, nothing that moves blocks
    assert (s.expandable_segments, s.max_split_size, s.text) == (False, DEFAULTS.max_split_size,
                                                                 "release_lock_on_cudamalloc:True,backend:native")


def _accountant(sizes_mib):
    """A real accountant (from its kept state): each block allocated then freed, in order, in one phase."""
    from pilotrun.probe.estimate import Accountant

    blocks, timeline = [], [0]
    for mib in sizes_mib:
        blocks.append([mib * MiB, "activations", len(timeline), len(timeline) + 1, False])
        timeline += [mib * MiB, 0]
    return Accountant.from_state({"cuda": True, "timeline": timeline, "stages": ["forward"] * len(timeline),
                                  "marks": {"train": [0, len(timeline) - 1]}, "cublas": {}, "blocks": blocks})


def test_a_kept_replay_is_reused_only_for_cards_whose_capacity_it_never_reached():
    from pilotrun.probe import stream

    acc = _accountant([40, 60])  # 40 MiB cached, then 60 MiB: 100 MiB reserved on a card that never fills

    def direct(capacity, total=None, settings=DEFAULTS):
        phases, _ = replay(stream.events(acc, workspace=0), settings, capacity, total)
        return {p.name: (p.peak_allocated, p.peak_reserved) for p in phases}

    def kept(capacity, total=None, settings=DEFAULTS):
        r = stream.replayed(acc, settings=settings, capacity=capacity, total=total or capacity, workspace=0)
        return {n: (v["peak_allocated"], v["peak_reserved"]) for n, v in r.items()}

    for cap in (200, 100, 80):  # 80 MiB: the retry path releases the cached 40 MiB, reserved 60 not 100
        assert kept(cap * MiB) == direct(cap * MiB), cap
    assert kept(80 * MiB)["train"][1] == 60 * MiB and kept(100 * MiB)["train"][1] == 100 * MiB
    with pytest.raises(OutOfMemory):
        kept(50 * MiB)
    # torch's defaults: the card's memory does not enter the replay, one replay serves every card it fits
    assert len([k for k in stream._REPLAYS[acc] if len(k) == 7]) == 1
    # expandable segments size their address space from the card: kept per card
    expandable = parse_settings("expandable_segments:True")
    for cap in (100, 300):
        assert kept(cap * MiB, settings=expandable) == direct(cap * MiB, cap * MiB, expandable)
    assert len([k for k in stream._REPLAYS[acc] if len(k) == 7]) == 3
