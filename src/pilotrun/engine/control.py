"""Control predictions: a few fixed inputs whose predictions and logits are stored with a run's artifact
(by train, the pilot's ranks and resume's reference run; read back by verify).

``verify`` reloads the artifact in a fresh process and reproduces them. The logits kept are, at each
target position, the TOPK largest of the training-time model and their ids (``control.safetensors``
in the run folder): a full vocabulary per position would be 600 KB per target on a 150k-token model,
and a model that reproduces the top of the distribution to within the tolerance reproduces its argmax.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pilotrun.engine.loop import to_device
from pilotrun.engine.precision import autocast
from pilotrun.journal.files import reading_weights
from pilotrun import jsonsafe
from pilotrun.tasks.base import BUILTIN_TASKS, IGNORE

if TYPE_CHECKING:
    from pilotrun.campaign.prepare import Prepared
    from pilotrun.journal.runs import RunRecorder

CONTROL_FILE = "control.safetensors"
CONTROL_EXAMPLES = 4  # validation examples whose predictions are stored with every run
TOPK = 8


def target_logits(task, model, batch) -> list | None:
    """Per example, the logits (float32, CPU) at its target positions; None for a task pilotrun cannot read."""
    if task.kind not in BUILTIN_TASKS:
        return None
    if hasattr(task, "target_logprobs"):  # preference: both halves' log-probabilities at their targets
        return task.target_logprobs(model, batch)
    inputs = getattr(task, "inputs", None)  # causal-lm's packed rows: their positions, no mask (tasks/causal_lm)
    logits = model(**(inputs(batch) if inputs else {"input_ids": batch["input_ids"],
                                                    "attention_mask": batch["attention_mask"]})).logits.float()
    if task.kind == "seq-cls":
        return [row.unsqueeze(0).cpu() for row in logits]
    target = batch["labels"][:, 1:]
    logits = logits[:, :-1]
    return [logits[i][target[i] != IGNORE].cpu() for i in range(logits.size(0))]


def predictions_and_logits(task, model, batch, logits: bool = True) -> tuple[list, list | None]:
    """The task's predictions on ``batch`` and (``logits``) its target logits. One forward pass where the
    predictions are the argmax of those logits (the built-in causal-lm and seq-cls tasks' own ``predict``):
    the second pass computed the same logits again (a SmolLM2 control batch: ~2 s of CPU each). Two passes
    otherwise (preference pairs, custom tasks)."""
    from pilotrun.tasks.causal_lm import CausalLMTask
    from pilotrun.tasks.seq_cls import SeqClsTask

    if not logits:
        return task.predict(model, batch), None
    if type(task).predict not in (CausalLMTask.predict, SeqClsTask.predict) or hasattr(task, "target_logprobs"):
        return task.predict(model, batch), target_logits(task, model, batch)
    per = target_logits(task, model, batch)
    if task.kind == "seq-cls":
        return [[int(lg.argmax(-1))] for lg in per], per
    return [lg.argmax(-1).tolist() for lg in per], per


def save_control(run_dir, rids: list[str], logits: list, meta: dict) -> Path:
    """The top-k logits and their ids per control example, with the rids and tokenizer facts as metadata."""
    from safetensors.torch import save_file

    tensors = {}
    for i, lg in enumerate(logits):
        k = min(TOPK, lg.size(-1))
        values, indices = lg.topk(k, dim=-1)
        tensors[f"{i}.values"] = values.contiguous()
        tensors[f"{i}.indices"] = indices.contiguous()
    path = Path(run_dir) / CONTROL_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"rids": json.dumps(rids), "meta": json.dumps(meta)})
    tmp.replace(path)
    return path


def load_control(path) -> dict:
    """{"rids": [...], "meta": {...}, "values": [tensor], "indices": [tensor]} from a control file."""
    from safetensors import safe_open

    with reading_weights(path, "stored control predictions"), safe_open(str(path), framework="pt") as f:
        md = f.metadata() or {}
        rids = jsonsafe.loads(md.get("rids", "[]"))
        values = [f.get_tensor(f"{i}.values") for i in range(len(rids))]
        indices = [f.get_tensor(f"{i}.indices") for i in range(len(rids))]
    return {"rids": rids, "meta": jsonsafe.loads(md.get("meta", "{}")), "values": values, "indices": indices}


def tokenizer_facts(task) -> dict:
    tok = getattr(task, "tokenizer", None)
    if tok is None:
        return {}
    return {"vocab": len(tok), "eos": tok.eos_token_id, "pad": tok.pad_token_id}


def control_predictions(prep: Prepared, model) -> tuple[list, list, object]:
    """The control inputs, the model's predictions on them and its top logits (None for a task without)."""
    import torch

    pool = prep.validation or prep.train
    control = pool[:CONTROL_EXAMPLES]
    if not control:
        return [], [], None

    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad(), autocast(prep.c.train.precision, device.type):
        batch = to_device(prep.task.collate(control), device)
        preds, logits = predictions_and_logits(prep.task, model, batch)
    return control, preds, logits


def store_control_predictions(recorder: RunRecorder, prep: Prepared, model, computed=None) -> list[dict]:
    """Predictions (journal) and top logits (control.safetensors) on the control inputs; before the manifest."""
    control, preds, logits = computed or control_predictions(prep, model)
    if not control:
        return []
    items = [(e.rid, {"input_ids": e.input_ids, "labels": e.labels, "pred": p, **({"meta": e.meta} if e.meta else {})})
             for e, p in zip(control, preds)]
    recorder.journal.add_predictions(recorder.run_id, "control", items)
    if logits is not None:  # verify compares the reloaded artifact's logits with these
        save_control(recorder.dir, [e.rid for e in control], logits,
                     {"dtype": str(next(model.parameters()).dtype), "tokenizer": tokenizer_facts(prep.task)})
    return [{"rid": rid, **v} for rid, v in items]
