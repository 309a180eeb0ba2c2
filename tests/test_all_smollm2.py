"""Issue 43's "must show": `all` on the real SmolLM2-135M-Instruct (chat, LoRA, bf16: auto) imported from an Axolotl
config, green end to end in fresh processes — no false verdict on the bf16 artifact, the pilot inside `all`
measuring the ledger of the same pilot alone, budgets said as used, every line of its output within 80 columns."""

from __future__ import annotations

import json

import pytest
import yaml


IMPORT_CONSTANTS = 4096  # bytes: tensors a library makes when imported (bitsandbytes' NF4/FP4 tables, 144 bytes)


def _tensor_ledger(journal, run_id: str) -> tuple[list[tuple], list[int]]:
    """The pilot's rows as the sheet reads them (peak and end per phase), and apart each row's baseline: a library
    `all` imported in an earlier stage (peft pulls in bitsandbytes) holds its import-time constants before the load
    phase starts, where the pilot alone imports it inside the load — the same bytes, in the baseline instead of the
    phase; a copy of anything `all` kept would be megabytes (issue 43: one model, 275 MiB)."""
    rows = journal.phase_rows(run_id)
    return [(r["phase"], r["rank"], r["peak_allocated"], r["end_allocated"]) for r in rows], \
        [r["baseline"] for r in rows]


@pytest.mark.slow
def test_all_is_green_on_smollm2_chat_lora_bf16_and_its_pilot_is_the_pilot_alone(tmp_path):
    from conftest import run_cli_process, smollm2_axolotl

    from pilotrun.journal.store import Journal

    src = smollm2_axolotl(tmp_path, "lora.yml", adapter="lora", lora_r=8, lora_alpha=16, lora_dropout=0.0,
                          lora_target_modules=["q_proj", "v_proj"], max_steps=4, optimizer="adamw_torch",
                          learning_rate=2e-4, bf16="auto", eval_steps=2, save_steps=2, sample_packing=True)
    out = tmp_path / "campaign.yaml"
    done = run_cli_process("import", src, "--out", out)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(out.read_text())["model"]["dtype"] == "bfloat16"
    assert yaml.safe_load(out.read_text())["data"]["packing"] is True

    home = tmp_path / "home"
    done = run_cli_process("all", out, "--home", home, "--quick", "--examples", "4", "--json", timeout=3000,
                           env={"OMP_NUM_THREADS": "1", "COLUMNS": "80"})
    envelope = json.loads(done.stdout)
    stages = {s["stage"]: s for s in envelope["stages"]}
    failed = {k: (s["verdict"], s["summary"], s["messages"][:6]) for k, s in stages.items() if s["verdict"] == "fail"}
    assert done.returncode in (0, 1) and not failed, (failed, done.stderr[-3000:])
    assert stages["verify"]["verdict"] == "ok", stages["verify"]  # item 1: the bf16 artifact is the trained model
    # item 3: sample_packing is rehearsed (data.packing): the pilot's rows are packed rows
    imported = stages.get("imported", {}).get("messages", [])  # no stage when every setting was carried
    assert "sample_packing" not in " ".join(imported), imported
    wide = [ln for ln in done.stderr.splitlines() if len(ln) > 80]
    assert not wide, wide[:5]

    # item 2: the pilot inside `all` measured what the same pilot measures alone, in its own fresh process
    alone = run_cli_process("pilot", out, "--home", tmp_path / "alone", "--json", timeout=1800,
                            env={"OMP_NUM_THREADS": "1"})
    assert alone.returncode == 0, alone.stderr[-2000:]
    inside, base_in = _tensor_ledger(Journal(home), Journal(home).list_runs(kind="pilot")[-1]["run_id"])
    solo, base_solo = _tensor_ledger(Journal(tmp_path / "alone"), json.loads(alone.stdout)["data"]["run_id"])
    assert inside == solo
    assert all(abs(a - b) <= IMPORT_CONSTANTS for a, b in zip(base_in, base_solo)), (base_in, base_solo)

    # item 7: the summary names the budget overfit used and the updates it took
    overfit = stages["overfit"]["data"]
    said = " ".join(done.stderr.split())  # the summary's budgets line, wrapped at 80 columns
    assert f"≤ {overfit['budget']['updates']} updates" in said and f"{overfit['updates']} taken" in said, said
