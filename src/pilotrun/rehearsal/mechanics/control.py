"""Control predictions: a few fixed inputs whose predictions and logits are stored with a run's artifact.

``verify`` reloads the artifact in a fresh process and reproduces them. The logits kept are, at each
target position, the TOPK largest of the training-time model and their ids (``control.safetensors``
in the run folder): a full vocabulary per position would be 600 KB per target on a 150k-token model,
and a model that reproduces the top of the distribution to within the tolerance reproduces its argmax.
"""

from __future__ import annotations

import json
from pathlib import Path

CONTROL_FILE = "control.safetensors"
CONTROL_EXAMPLES = 4  # validation examples whose predictions are stored with every run
TOPK = 8


def target_logits(task, model, batch) -> list | None:
    """Per example, the logits (float32, CPU) at its target positions; None for a task pilotrun cannot read."""
    from pilotrun.tasks.base import IGNORE

    if task.kind not in ("causal-lm", "seq-cls"):
        return None
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if task.kind == "seq-cls":
        return [row.unsqueeze(0).cpu() for row in logits]
    target = batch["labels"][:, 1:]
    logits = logits[:, :-1]
    return [logits[i][target[i] != IGNORE].cpu() for i in range(logits.size(0))]


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

    from pilotrun.journal.files import reading_weights

    with reading_weights(path, "stored control predictions"), safe_open(str(path), framework="pt") as f:
        md = f.metadata() or {}
        rids = json.loads(md.get("rids", "[]"))
        values = [f.get_tensor(f"{i}.values") for i in range(len(rids))]
        indices = [f.get_tensor(f"{i}.indices") for i in range(len(rids))]
    return {"rids": rids, "meta": json.loads(md.get("meta", "{}")), "values": values, "indices": indices}


def tokenizer_facts(task) -> dict:
    tok = getattr(task, "tokenizer", None)
    if tok is None:
        return {}
    return {"vocab": len(tok), "eos": tok.eos_token_id, "pad": tok.pad_token_id}
