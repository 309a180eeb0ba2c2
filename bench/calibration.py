"""The caching allocator's replay against an H200's pilots: predicted ÷ measured per campaign and phase.

    python bench/calibration.py            # prints the Markdown tables of bench/RESULTS.md's calibration section

Not a timing: it traces the five campaigns bench/gpu_check.py measured (the demo in fp32 and bf16-mixed, a 4-layer
512-wide Llama in both, an 8-layer 1024-wide one in bf16-mixed) with ``pilotrun estimate --device cuda``'s trace
(probe/trace.py, its rows replayed through probe/allocator.py) and divides by the measured figures of
tests/calibration/h200-2026-12-04.json (its provenance there). tests/test_calibration.py runs the same comparison.

Goals (issue 42): reserved within 0.97-1.05 in every cell (within 4 MiB where the cell is under 80 MiB),
allocated within 0.98-1.02 (the same 4 MiB rule: the recorded figures are whole MiB).

The trace runs the installed transformers; the H200 ran 5.17, whose KV cache held the values in the keys' dtype
(``as_measured``): the campaigns are traced with that cache, so the comparison is of the code that was measured.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "calibration" / "h200-2026-12-04.json"
MiB = 2**20
GOALS = {"reserved": (0.97, 1.05), "allocated": (0.98, 1.02)}
SMALL_MIB, SMALL_OFF_MIB = 80, 4


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_campaigns(folder: Path, small: bool = False) -> dict[str, Path]:
    """The measured campaigns, written as bench/gpu_check.py wrote them on the GPU (``small``: its dry run's
    shrunk models, for a CPU)."""
    from pilotrun.demo.synth import write_demo

    g = _gpu_check()
    shrink = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4) if small else {}
    write_demo(folder / "demo")
    g.write_campaign(folder / "wide", g.campaign("wide512", dict(g.WIDE, **shrink), 512, 8, 16), 200 if small else 1000)
    g.write_campaign(folder / "wider", g.campaign("wider1024", dict(g.WIDER, **shrink), 1024, 4, 8),
                     300 if small else 2000)
    return {"demo": folder / "demo" / "campaign.yaml", "wide512": folder / "wide" / "campaign.yaml",
            "wider1024": folder / "wider" / "campaign.yaml"}


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def predicted(paths: dict[str, Path], only: list[str] | None = None) -> dict[str, dict[str, tuple[int, int]]]:
    """Per campaign of the fixture and phase: (allocated, reserved) bytes as ``estimate --device cuda`` rows give, traced
    with the measured transformers' cache (``as_measured``)."""
    from pilotrun.campaign import load_campaign
    from pilotrun.probe.trace import trace

    out = {}
    with as_measured():
        for name, c in fixture()["campaigns"].items():
            if only and name not in only:
                continue
            loaded = load_campaign(paths[c["campaign"]], dict(s.split("=", 1) for s in c["sets"]))
            out[name] = {r["phase"]: (r["peak_allocated"], r["peak_reserved"])
                         for r in trace(loaded, device="cuda")["rows"]}
    return out


def values_in_key_dtype() -> bool:
    """Whether transformers' DynamicLayer (as it is now) caches a layer's values in its keys' dtype, as 5.17 did."""
    import torch
    from transformers.cache_utils import DynamicLayer

    layer = DynamicLayer()
    layer.lazy_initialization(torch.empty(1, 1, 1, 8), torch.empty(1, 1, 1, 8, dtype=torch.bfloat16))
    return layer.values.dtype == torch.float32


@contextlib.contextmanager
def as_measured():
    """Inside, transformers' KV cache is initialised as the measured run's (the fixture's provenance: transformers
    5.17). Its ``DynamicLayer.lazy_initialization`` made both caches in the keys' dtype; under bf16-mixed the keys are
    float32 (the rotary product promotes them), so ``torch.cat`` cast every layer's values to float32 and the cache
    held them at twice their size: 32 MiB more than a later transformers on wide512's evaluation (4 layers), 128 MiB
    on wider1024's (8 layers). Later versions make the values' cache in their own dtype; where the installed one does,
    it gets 5.17's initialisation for the calibration's traces (an estimate traces the installed code)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers 4: no layered cache, nothing this calibration measured
        yield
        return
    if values_in_key_dtype():
        yield
        return
    original = DynamicLayer.lazy_initialization

    def lazy_initialization(self, key_states, value_states):
        original(self, key_states, value_states)
        self.values = self.values.to(key_states.dtype)  # both in the keys' dtype, as 5.17 made them

    DynamicLayer.lazy_initialization = lazy_initialization
    try:
        yield
    finally:
        DynamicLayer.lazy_initialization = original


def within(kind: str, predicted_bytes: float, measured_mib: int) -> bool:
    if measured_mib < SMALL_MIB:
        return abs(predicted_bytes / MiB - measured_mib) <= SMALL_OFF_MIB
    lo, hi = GOALS[kind]
    return lo <= predicted_bytes / MiB / measured_mib <= hi


def cells(pred: dict) -> list[dict]:
    """Every (campaign, phase, counter) cell: measured MiB, predicted now and then, ratios, and the goal's verdict."""
    fx = fixture()["measured_mib"]
    out = []
    for name, phases in pred.items():
        for phase, (alloc, res) in phases.items():
            m_alloc, m_res, then_alloc, then_res = fx[name][phase]
            for kind, now, measured, then in (("reserved", res, m_res, then_res), ("allocated", alloc, m_alloc, then_alloc)):
                out.append({"campaign": name, "phase": phase, "kind": kind, "measured": measured, "now": now / MiB,
                            "then": then, "ratio": now / MiB / measured, "then_ratio": then / measured,
                            "ok": within(kind, now, measured)})
    return out


def markdown(all_cells: list[dict]) -> str:
    names = list(dict.fromkeys(c["campaign"] for c in all_cells))
    phases = list(dict.fromkeys(c["phase"] for c in all_cells))
    lines = []
    for kind in ("reserved", "allocated"):
        lo, hi = GOALS[kind]
        lines += ["", f"{kind.capitalize()}, predicted ÷ measured (replay now; the estimate of 2026-12-04 in brackets), "
                      f"goal {lo:.2f}–{hi:.2f} (within {SMALL_OFF_MIB} MiB under {SMALL_MIB} MiB; ✗ outside):", "",
                  "| phase | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for phase in phases:
            row = []
            for name in names:
                c = next(x for x in all_cells if x["campaign"] == name and x["phase"] == phase and x["kind"] == kind)
                row.append(f"{c['now']:.0f}/{c['measured']} = {c['ratio']:.3f}{'' if c['ok'] else ' ✗'} "
                           f"({c['then_ratio']:.2f})")
            lines.append(f"| {phase} | " + " | ".join(row) + " |")
        inside = [c for c in all_cells if c["kind"] == kind]
        lines.append("")
        lines.append(f"{sum(c['ok'] for c in inside)} of {len(inside)} cells within the goal; ratios "
                     f"{min(c['ratio'] for c in inside):.3f}–{max(c['ratio'] for c in inside):.3f} "
                     f"(then {min(c['then_ratio'] for c in inside):.2f}–{max(c['then_ratio'] for c in inside):.2f}).")
    return "\n".join(lines) + "\n"


def main() -> int:
    import tempfile

    sys.path.insert(0, str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="pilotrun-calibration-") as tmp:
        print(markdown(cells(predicted(write_campaigns(Path(tmp))))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
