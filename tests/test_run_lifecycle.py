"""One run lifecycle (journal/runs.py): every path that makes a run hashes its config the same way and
ends it the same way (completed, failed naming the exception, interrupted on Ctrl-C)."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import simple_records, tiny_causal_campaign


def _loaded(tmp_path):
    from pilotrun.campaign.load import load_campaign

    return load_campaign(tiny_causal_campaign(tmp_path, simple_records(16), simple_records(4, 100),
                                              train__updates=2, train__eval_every=2))


def test_the_same_campaign_has_one_config_hash_through_every_path(tmp_path):
    pytest.importorskip("accelerate")
    import callback_workers as workers

    from pilotrun.integrations.hf_trainer import PilotrunCallback
    from pilotrun.journal.store import Journal
    from pilotrun.probe.recorder import own_run
    from pilotrun.provenance import config_sha256
    from pilotrun.rehearsal.training.train import train_run

    loaded = _loaded(tmp_path)
    home = tmp_path / "home"
    expected = loaded.config_sha256()
    assert expected == config_sha256(loaded.resolved_dict())
    # the hash the callbacks and the own-loop recorder used to compute: the same config, another hash
    old = hashlib.sha256(json.dumps(loaded.resolved_dict(), sort_keys=True).encode()).hexdigest()
    assert old != expected

    train = train_run(loaded, home)
    assert train.verdict == "ok", train.messages
    cb = PilotrunCallback(home=home, name="tiny", config=loaded.resolved_dict())
    workers.tiny_hf_trainer(tmp_path, cb, steps=2, eval_steps=10, save_steps=10).train()
    with own_run(home, name="own", config=loaded.resolved_dict()) as run:
        with run.phase("step"):
            pass

    journal = Journal(home)
    runs = {r["kind"]: r for r in journal.list_runs()}
    assert set(runs) == {"train", "hf-trainer", "phases"}
    assert {k: r["config_sha256"] for k, r in runs.items()} == {k: expected for k in runs}
    assert all(r["status"] == "completed" for r in runs.values())
    revisions = json.loads((journal.run_dir(train.data["run_id"]) / "revisions.json").read_text())
    assert revisions["config_sha256"] == expected


def test_a_run_ends_failed_naming_the_exception_or_interrupted_on_ctrl_c(tmp_path):
    from pilotrun.journal.runs import RunRecorder
    from pilotrun.journal.store import Journal
    from pilotrun.probe.recorder import own_run

    loaded, home = _loaded(tmp_path), tmp_path / "home"
    with pytest.raises(ValueError), own_run(home, name="own") as run:
        raise ValueError("broken batch")
    with pytest.raises(KeyboardInterrupt), RunRecorder(Journal(home), loaded, kind="train") as rec:
        raise KeyboardInterrupt
    journal = Journal(home)
    failed, interrupted = journal.require_run(run.run_id), journal.require_run(rec.run_id)
    assert failed["status"] == "failed" and failed["summary"]["reason"] == "ValueError: broken batch"
    assert interrupted["status"] == "interrupted"
    assert interrupted["summary"]["reason"] == "interrupted by the user (Ctrl-C)"
    with RunRecorder(journal, loaded, kind="train") as done:
        pass
    assert journal.require_run(done.run_id)["status"] == "completed"
