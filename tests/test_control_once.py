"""engine/control.predictions_and_logits: the control predictions and their target logits from one forward
pass for the built-in causal-lm and seq-cls tasks, identical to the task's own ``predict`` and
``target_logits`` run one after the other (the two passes it replaces)."""

import torch
from conftest import simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.campaign.prepare import prepare
from pilotrun.engine.control import predictions_and_logits, target_logits


def _forwards(model) -> list:
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_one_pass_gives_the_two_passes_predictions_and_logits(tmp_path):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, start=50))
    prep = prepare(load_campaign(path), splits=("train", "validation"))
    torch.manual_seed(0)
    model = prep.task.build_model().eval()
    batch = prep.task.collate(prep.validation[:4])
    calls = _forwards(model)
    with torch.no_grad():
        preds, logits = predictions_and_logits(prep.task, model, batch)
        assert len(calls) == 1
        want_preds, want_logits = prep.task.predict(model, batch), target_logits(prep.task, model, batch)
    assert preds == want_preds and all(len(p) > 1 for p in preds)
    assert all(torch.equal(a, b) for a, b in zip(logits, want_logits))
    with torch.no_grad():  # without the logits asked for: the task's predict alone
        assert predictions_and_logits(prep.task, model, batch, logits=False) == (want_preds, None)


def test_a_task_with_its_own_predict_keeps_two_passes(tmp_path):
    """A predict that is not the argmax of the target logits (here: every id shifted by one) is called as it is."""
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, start=50))
    prep = prepare(load_campaign(path), splits=("train", "validation"))
    task, base = prep.task, type(prep.task)
    own = type("ShiftedTask", (base,), {"predict": lambda self, m, b: [[i + 1 for i in p]
                                                                         for p in base.predict(self, m, b)]})
    task.__class__ = own
    model = task.build_model().eval()
    batch = task.collate(prep.validation[:4])
    with torch.no_grad():
        preds, logits = predictions_and_logits(task, model, batch)
    assert preds == [[int(i) + 1 for i in lg.argmax(-1)] for lg in logits]
