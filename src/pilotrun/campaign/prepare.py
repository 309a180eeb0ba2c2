"""Shared set-up of the stages: campaign → task → encoded splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pilotrun.campaign import reuse
from pilotrun.campaign.arithmetic import batch_arithmetic
from pilotrun.campaign.consistency import check_consistency
from pilotrun.console.progress import note, spending
from pilotrun.data.prefetch import encode_all
from pilotrun.tasks import make_task
from pilotrun.tasks.common import SPLITS
from pilotrun.errors import BadInput
from pilotrun.tasks.hub import fetch_command, snapshot_of
from pilotrun.tasks.loading import architecture_only, check_model_dir, check_positions, lora_targets, lora_wrapped
from pilotrun.tasks.moe import adapted_moe_parts, moe_parts
from pilotrun.tasks.packing import examples_in, pack, summary as packing_summary
from pilotrun.tasks.weights_fit import check_weights_fit
from pilotrun.tasks.base import BUILTIN_TASKS
from pilotrun.tasks.common import read_split
from pilotrun.tasks.shapes import shape_examples, tokenizer_absent


@dataclass
class Prepared:
    loaded: Any
    task: Any
    examples: dict[str, list] = field(default_factory=dict)
    shapes: str | None = None
    """Set when the rows are shapes, not the data (config.json alone, no tokenizer): what they are and why."""

    @property
    def c(self):
        return self.loaded.campaign

    @property
    def train(self) -> list:
        return self.examples.get("train", [])

    @property
    def validation(self) -> list:
        return self.examples.get("validation", [])

    def arithmetic(self) -> dict:
        packed = {"examples": examples_in(self.train)} if self.c.data.packing else None
        return batch_arithmetic(self.c.train, len(self.train), packed)

    def shapes_said(self) -> str:
        """Which sequence shapes an estimate of these rows used, in words."""
        if self.shapes:
            return f"sequence shapes: {self.shapes}"
        return (f"sequence shapes: the data's worst case (its longest rows, tokenized; data.max_length "
                f"{self.c.data.max_length} truncates)")


def require_weights(loaded) -> None:
    """A stage that runs the model (pilot, overfit, train, resume, fit) needs its weights: a hub model whose
    config.json alone is cached is exit 2 here, naming the missing files, before any run is created
    (``validate``, ``estimate`` and the sheet without a pilot work from the config); so is a folder whose weights'
    headers disagree with the model its config.json describes (``tasks.loading.check_weights_fit``)."""
    from pathlib import Path

    path = loaded.campaign.model.path
    if path and snapshot_of(path):
        check_model_dir(Path(path))
    if path and loaded.campaign.task in BUILTIN_TASKS:
        with spending("model"):  # the architecture's modules imported and built on the meta device: the model's load
            check_weights_fit(loaded.campaign, loaded.campaign.task)  # names and shapes against the headers


def prepare(loaded, splits=SPLITS, *, shapes: bool = False) -> Prepared:
    """Validate, build the task and encode every record of the splits through task.encode (inside ``all``, once
    per campaign identity and split: ``campaign/reuse.encoded``).

    ``shapes`` (the estimator's callers: estimate, ``estimate --options``, the sheet's predictions): a built-in task
    whose tokenizer folder holds no tokenizer (a hub model's config.json alone) gets rows of data.max_length
    tokens over the config's vocabulary instead (``tasks/shapes.py``), one per record; without ``shapes`` such a
    campaign is exit 2 naming the folder."""
    with spending("data"):
        if loaded.campaign.task in BUILTIN_TASKS and tokenizer_absent(loaded.campaign) is not None:
            return _shapes(loaded, splits, shapes)
        if not reuse.shared():
            task = _task(loaded)
            return Prepared(loaded, task, _encoded(task, splits))
        kept = reuse.encoded(loaded, splits, lambda: _task(loaded, keep=True), _encoded)
        return Prepared(loaded, kept["task"], {k: list(v) for k, v in kept["splits"].items()  # the stage's own lists
                                               if k in splits and v})


def _shapes(loaded, splits, allowed: bool) -> Prepared:
    c = loaded.campaign
    folder = tokenizer_absent(c)
    hub = snapshot_of(folder)
    where = f"{hub[0]} (commit {hub[1][:12]})" if hub else str(folder)
    if not allowed:
        raise BadInput(f"no tokenizer {'cached for' if hub else 'in'} {where}: its config.json alone, and this stage "
                       "tokenizes the data", where="model.tokenizer" if c.model.tokenizer else "model.path",
                       fix=(f"fetch the model with `{fetch_command(hub[0])}`" if hub else
                            "point model.tokenizer at the model's tokenizer folder")
                           + "; estimate, estimate --options and the sheet without a pilot work from config.json alone")
    task = _task(loaded)
    vocab, length = len(task.tokenizer), c.data.max_length
    examples = {}
    for split in splits:
        n = len(read_split(c, split))
        if n:
            examples[split] = shape_examples(task.kind, n, length, vocab, split)
    said = (f"data.max_length ({length} tokens) for every row, one per record: no tokenizer "
            f"{'cached for' if hub else 'in'} {where}, so the data is not tokenized; the vocabulary ({vocab:,} "
            "tokens) from config.json")
    return Prepared(loaded, task, examples, shapes=said)


def _task(loaded, keep: bool = False):
    check_consistency(loaded.campaign, loaded.base_dir)
    if loaded.campaign.task in BUILTIN_TASKS:
        check_positions(loaded.campaign)  # with model.config's class defaults, before anything runs
        adapter_choice(loaded)  # LoRA's modules exist in the model (or the family has a default)
    task = make_task(loaded)
    if keep:
        reuse.keep_pristine(task, loaded)  # a later stage's build is a fresh copy of the weights read here
    return task


def _encoded(task, splits) -> dict[str, list]:
    """Each split's records encoded ([] for a split without records: the caller keeps only the others), the
    tokenizer asked for a chunk of records' texts at once (data/prefetch.py)."""
    examples = {}
    for split in splits:
        note(f"reading and encoding the {split} split", log=True)
        records = task.records(split)
        examples[split] = encode_all(task, records) if records else []
        if task.c.data.packing and examples[split]:
            examples[split] = pack(examples[split], task.c.data.max_length)
            note(f"the {split} split: {packing_summary(examples[split], task.c.data.max_length)}", log=True)
    return examples


def _plain_on_meta(loaded):
    """A built-in task's architecture without its adapter, on the meta device (no memory, no weights read); None
    without an adapter or for a custom task."""
    c = loaded.campaign
    if c.model.adapter is None or c.task not in BUILTIN_TASKS:
        return None
    import torch

    plain = loaded.with_overrides({"model.adapter": None, "model.gradient_checkpointing": False})
    with torch.device("meta"), architecture_only():
        return make_task(plain).build_model()


def adapter_choice(loaded) -> tuple[list[str], str] | None:
    """The LoRA modules a built-in task's campaign adapts and why (``lora_targets``), checked on the architecture
    built on the meta device before anything runs; None without an adapter."""
    model = _plain_on_meta(loaded)
    return None if model is None else lora_targets(model, loaded.campaign.model.adapter)


def adapted_router(loaded) -> str | None:
    """What LoRA adapts of a mixture of experts beyond its attention, when that includes a router: a line for the
    rehearsal to warn with (a router trained with LoRA moves tokens between experts as it trains and can unbalance
    them; PEFT's and the trainers' defaults leave it frozen). None for a dense model, no adapter, or a frozen router.
    PEFT is applied to the architecture built on the meta device, so ``all-linear`` says what it really wraps."""
    model = _plain_on_meta(loaded)
    parts = moe_parts(model) if model is not None else ([], [])  # before LoRA wraps them
    if not any(parts):
        return None
    c = loaded.campaign
    routers, experts = adapted_moe_parts(parts, lora_wrapped(model, c.model.adapter, c.task))
    if not routers:
        return None
    also = f" and the experts ({', '.join(experts)})" if experts else ""
    return (f"LoRA adapts the router ({', '.join(routers)}) of this mixture of experts{also}: trained, it moves "
            "tokens between experts and can unbalance them (PEFT's and the trainers' defaults leave it frozen); to "
            "keep it frozen, name the attention projections in model.adapter.target_modules (or leave it out for "
            "the family's default)")
