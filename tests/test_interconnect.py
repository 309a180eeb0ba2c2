"""The interconnect is the user's: the rates file's `interconnect:` names the bandwidth inside a node and
between nodes; the options' communication time uses it, and the defaults say where they come from."""

import pytest

from pilotrun.errors import BadInput
from pilotrun.sheet.catalogue import BY_KEY
from pilotrun.sheet.option_time import NODE_GBS, campaign_seconds as _seconds
from pilotrun.sheet.options import _assumptions
from pilotrun.sheet.rates import read_rates

# a 70B model's figures as the estimator reports them (bf16 weights), one update of 16 × 4096 tokens
TRACE = {"params": 70e9, "trainable": 70e9, "gradient_checkpointing": True, "param_bytes": 140e9,
         "trainable_bytes": 140e9}
WORK = {"precision": "bf16-mixed", "tokens_update": 16 * 4096, "updates": 100, "evals": 0, "tokens_val": 0,
        "eval_batches": 0, "runs": 1}


def test_the_rates_files_interconnect_sets_the_communication_time(tmp_path):
    f = tmp_path / "rates.yaml"
    f.write_text("h100-sxm: 2.49\ninterconnect:\n  inter_node_gbs: 50\n")
    rates = read_rates(f)
    assert rates["interconnect"] == {"where": f"{f}:2", "intra_node_gbs": None, "inter_node_gbs": 50.0}
    g = BY_KEY["h100-sxm"]
    default, _ = _seconds(g, 16, TRACE, "fsdp", False, False, dict(WORK, net={}), 1)
    ours, _ = _seconds(g, 16, TRACE, "fsdp", False, False, dict(WORK, net=rates["interconnect"]), 1)
    # FSDP moves 3 × 140 GB per update over the ring: 12.5 → 50 GB/s takes 3 × 140 × 15/16 × (1/12.5 − 1/50) s off
    saved = 100 * 3 * 140e9 * 15 / 16 * (1 / (NODE_GBS * 1e9) - 1 / 50e9)
    assert default - ours == pytest.approx(saved, rel=1e-6)
    same, _ = _seconds(g, 8, TRACE, "fsdp", False, False, dict(WORK, net=rates["interconnect"]), 1)
    assert same == _seconds(g, 8, TRACE, "fsdp", False, False, dict(WORK, net={}), 1)[0]  # one node: NVLink
    words = " ".join(_assumptions(None, rates["interconnect"]))
    assert f"50 GB/s between nodes ({f}:2: interconnect)" in words
    assert "12.5 GB/s between nodes (default: 100 Gb/s per GPU)" in " ".join(_assumptions(None, {}))
    assert "say yours under `interconnect:` in the rates file" in " ".join(_assumptions(None, {}))


@pytest.mark.parametrize("text, message", [
    ("interconnect:\n  inter_node_gbs: 0\n", "inter_node_gbs 0 is not a bandwidth > 0"),
    ("interconnect:\n  nvlink: 900\n", "unknown key(s) 'nvlink'"),
    ("interconnect: fast\n", "interconnect is 'fast', not a mapping"),
])
def test_a_bad_interconnect_is_bad_input_naming_the_line(tmp_path, text, message):
    f = tmp_path / "rates.yaml"
    f.write_text("a100-80gb: 1.29\n" + text)
    with pytest.raises(BadInput) as e:
        read_rates(f)
    assert message in str(e.value) and f"{f}:2: interconnect" in str(e.value) and "GB/s per GPU" in str(e.value)
