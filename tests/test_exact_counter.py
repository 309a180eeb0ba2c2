"""The exact CPU counter (engine/tensors.py): live tensor bytes with a true peak, deterministic, blind to
the heap; and the watch's choice of the updates it probes (probe/watch.py)."""

from __future__ import annotations

import torch

from conftest import TINY_LLAMA
from pilotrun.probe.memory import RssProbe, TensorProbe, _rss_now, make_probe
from pilotrun.engine.tensors import track
from pilotrun.probe.watch import SPOT_EVERY, PeakWatch, exact_updates

MiB = 2**20


def _model_and_optimizer():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _update(model, opt, ids):
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_cpu_default_is_the_exact_counter_labelled_beside_rss():
    probe = make_probe("cpu")
    assert isinstance(probe, TensorProbe) and probe.counter == "tensors+rss"
    assert isinstance(make_probe("cpu", exact=False), RssProbe)
    probe.start()
    x = torch.ones(8 * MiB // 4)
    row = probe.stop()
    assert row["end_allocated"] - row["baseline"] == 8 * MiB  # exactly the tensor's bytes
    assert row["peak_reserved"] >= row["end_reserved"] > row["end_allocated"] > 0  # RSS holds more than tensors
    del x


def test_the_same_phase_twice_gives_the_same_peak():
    model, opt = _model_and_optimizer()
    ids = torch.randint(0, 384, (4, 96))
    _update(model, opt, ids)  # the optimizer state exists from here on
    probe, rows = make_probe("cpu"), []
    track(model, opt)  # made outside any phase: counted from here, as the loop does
    for _ in range(3):
        probe.start()
        _update(model, opt, ids)
        rows.append(probe.stop())
    peaks = {(r["baseline"], r["peak_allocated"], r["end_allocated"]) for r in rows}
    assert len(peaks) == 1, rows
    baseline, peak, end = peaks.pop()
    assert peak > baseline == end  # activations and gradients came and went; nothing leaked


def test_a_longer_batch_gives_a_larger_peak():
    model, opt = _model_and_optimizer()
    _update(model, opt, torch.randint(0, 384, (4, 16)))
    track(model, opt)
    probe, peaks = make_probe("cpu"), {}
    for length in (32, 96, 32):
        probe.start()
        _update(model, opt, torch.randint(0, 384, (4, length)))
        r = probe.stop()
        peaks.setdefault(length, set()).add(r["peak_allocated"] - r["baseline"])
    assert len(peaks[32]) == 1 and max(peaks[32]) < min(peaks[96])


def test_a_spike_inside_the_phase_is_seen_where_rss_at_its_ends_is_not():
    x = torch.ones(64 * MiB // 4)
    probe = make_probe("cpu")
    probe.start()
    rss0 = _rss_now()
    total = float((x * 2).sum())  # a 64 MiB intermediate, freed before the next operator returns
    rss1 = _rss_now()
    row = probe.stop()
    assert total == 2 * x.numel()
    assert row["peak_allocated"] - row["baseline"] >= 64 * MiB, row
    assert row["end_allocated"] == row["baseline"]
    # what sampling RSS around the phase reads: the spike is gone (freed, returned to the system)
    assert rss1 - rss0 < 16 * MiB, (rss0, rss1)


def test_a_freed_tensor_leaves_the_count_and_nested_phases_keep_the_outer_peak():
    outer, inner = make_probe("cpu"), make_probe("cpu")
    outer.start()
    big = torch.ones(32 * MiB // 4)
    del big
    inner.start()
    small = torch.ones(MiB // 4)
    r_in = inner.stop()
    r_out = outer.stop()
    assert r_in["peak_allocated"] - r_in["baseline"] == MiB
    assert r_out["peak_allocated"] - r_out["baseline"] >= 32 * MiB  # the inner start did not reset it
    assert r_out["end_allocated"] - r_out["baseline"] == MiB
    del small


def test_watch_probes_first_updates_records_and_spot_checks_only():
    lengths = [10, 10, 8, 12, 12, 5, 11, 20] + [3] * (SPOT_EVERY + 2)
    watch = PeakWatch("cpu")
    picked = []
    for i, n in enumerate(lengths):
        with watch("train", {"update": i + 1, "seq_len": n, "tokens": 4 * n}):
            pass
        picked.append(watch.probed.get("train", 0))
    chosen = [i + 1 for i in range(len(lengths)) if picked[i] > (picked[i - 1] if i else 0)]
    assert chosen == [1, 2, 4, 8, SPOT_EVERY]  # first two, records 12 and 20, the spot check
    assert watch.rows()[0]["inputs"]["probed"] == 5 and watch.rows()[0]["inputs"]["blocks"] == len(lengths)
    # the time plan's count of them (sheet/time_plan.py) is the watch's, from the same keys
    assert exact_updates([(n, 4 * n) for n in lengths]) == 5
    assert exact_updates([(n, 4 * n) for n in lengths[:1]]) == 1 and exact_updates([]) == 0
    for _ in range(3):
        with watch("evaluation", {"update": 0}):
            pass
    assert watch.probed["evaluation"] == 2 and watch.count["evaluation"] == 3
    every = PeakWatch("cpu", every_block=True)
    for n in (5, 5, 5):
        with every("train", {"seq_len": n, "tokens": n}):
            pass
    assert every.probed["train"] == 3


def _in_a_plain_process(body: str) -> None:
    """Run ``body`` in a fresh interpreter that froze nothing of its own (this session did: conftest.py)."""
    import subprocess
    import sys
    import textwrap

    p = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("ok"), p.stdout


def test_the_seed_counts_tensors_that_release_free_memory_froze():
    """release_free_memory freezes what survives its collection (gc.freeze), and gc.get_objects skips frozen
    objects: the seed counts them too, or a baseline would miss a tensor alive before the run's model."""
    _in_a_plain_process("""
        import gc, torch
        from pilotrun.engine.tensors import FROZEN, LiveTensors
        from pilotrun.probe.memory import release_free_memory
        held = torch.ones(8 * 2**20 // 4)
        release_free_memory()
        assert not FROZEN.done and gc.get_freeze_count() > 0 and not any(o is held for o in gc.get_objects())
        live = LiveTensors()
        live.seed()
        assert live.table[held.untyped_storage()._cdata][0] == 8 * 2**20
        assert gc.get_freeze_count() > 0  # what was frozen stays frozen
        print("ok")
    """)


def test_release_free_memory_collects_a_cycle_it_froze_the_time_before():
    """A cycle alive at one call and garbage after it is left alone by ordinary collections (frozen) and
    collected by the next call, which unfreezes before it collects."""
    _in_a_plain_process("""
        import gc, weakref
        from pilotrun.probe.memory import release_free_memory
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        release_free_memory()
        del a, b
        gc.collect()
        assert gone() is not None
        release_free_memory()
        assert gone() is None
        print("ok")
    """)


def test_a_process_that_froze_its_own_keeps_it_frozen_and_collects_everything_made_since():
    """freeze_process (the zygote after its imports, this test session after its collection): what it froze stays
    frozen through every release_free_memory, which then collects in full everything made since (a cycle alive at
    one call and garbage at the next among it) and freezes none of it; the exact counter's passes still count the
    tensors it froze without unfreezing anything. Planted defects, each caught: release unfreezing and freezing
    as before (what a run made is frozen; the cycle survives an ordinary collection), the counter's pass
    unfreezing and freezing (the run's tensor frozen), the pass without the remembered tensors (one missed)."""
    _in_a_plain_process("""
        import gc, weakref, torch
        from pilotrun.engine.tensors import LiveTensors
        from pilotrun.engine.tensors import FROZEN, freeze_process
        from pilotrun.probe.memory import release_free_memory
        before = torch.ones(2**20 // 4)  # alive when the process froze its own: 1 MiB
        freeze_process()
        frozen = gc.get_freeze_count()
        assert FROZEN.done and frozen > 0 and not any(o is before for o in gc.get_objects())
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        made = torch.ones(2 * 2**20 // 4)  # a run's tensor, made after: 2 MiB
        release_free_memory()
        assert gc.get_freeze_count() == frozen, "release froze what was made after the process froze its own"
        assert any(o is a for o in gc.get_objects()) and any(o is made for o in gc.get_objects())
        del a, b
        gc.collect()  # an ordinary collection: the cycle was never frozen
        assert gone() is None
        live = LiveTensors()
        live.seed()
        assert live.table[before.untyped_storage()._cdata][0] == 2**20  # frozen, and counted
        assert live.table[made.untyped_storage()._cdata][0] == 2 * 2**20
        assert gc.get_freeze_count() == frozen, "the counter's pass froze what is alive now"
        assert any(o is made for o in gc.get_objects())
        print("ok")
    """)
