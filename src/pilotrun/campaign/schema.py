"""The campaign file as typed models: one docstring per key (SPEC.md "Campaign file").

Only pydantic and the ground's errors and sizes are imported here, so ``validate`` stays fast.
"""

from __future__ import annotations

import decimal
import string
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, ValidationInfo,
                      field_validator, model_validator)

from pilotrun.sizes import parse_size
from pilotrun.errors import EXPONENT_FIX, EXPONENT_NUMBER, BadInput, beyond_a_float

# allow_inf_nan=False: .inf / .nan are refused for every number, in the file and through --set
_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=False, allow_inf_nan=False)


def _number_kind(ann) -> str | None:
    """"number" where a field's type takes an int or a float (under Optional or Annotated), "numbers" where it is a list
    of them, else None. bool is its own type here, though Python counts it an int."""
    origin = get_origin(ann)
    if ann in (int, float):
        return "number"
    if origin is Annotated:
        return _number_kind(get_args(ann)[0])
    if origin in (Union, types.UnionType):
        kinds = {_number_kind(a) for a in get_args(ann)} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    if origin is list and _number_kind(get_args(ann)[0]) == "number":
        return "numbers"
    return None


def _whole_kind(ann) -> bool:
    """Whether the number a field takes (under Optional, Annotated or a list) is an int."""
    if ann is int:
        return True
    if get_origin(ann) in (Annotated, list):
        return _whole_kind(get_args(ann)[0])
    if get_origin(ann) in (Union, types.UnionType):
        return any(_whole_kind(a) for a in get_args(ann) if a is not type(None))
    return False


def _as_written(v: Any, whole: bool) -> Any:
    """A number written with an exponent, as the number it is. ``updates: 1e5`` is read as 100000: YAML 1.1 leaves an
    exponent without a dot as text, which pydantic would refuse as "unable to parse string as an integer" where
    ``1.0e+5`` (a YAML float) reads as 100000; one that is not whole (``2.5e0``) is refused, naming what it is; one
    past what a float holds (``errors.beyond_a_float``) too."""
    if not isinstance(v, str) or len(v) > 400 or not EXPONENT_NUMBER.fullmatch(v):
        return v
    problem = beyond_a_float(v)
    if problem:  # quoted ("1e-400"), so yamlsafe let it pass as text
        raise ValueError(f"{problem}; {EXPONENT_FIX}")
    if not whole:
        return v
    d = decimal.Decimal(v.strip())
    if d != d.to_integral_value():
        raise ValueError(f"{v.strip()} is {d:f}, not a whole number; write a whole number")
    return int(d)


class Section(BaseModel):
    """A part of the campaign file. Its numbers refuse booleans: pydantic's lax mode reads ``true`` as 1 and
    ``false`` as 0, and YAML reads ``yes``, ``on``, ``no`` and ``off`` as booleans, so ``micro_batch: on`` would
    rehearse one example and ``warmup: off`` none, without a word. Strings of digits stay accepted (``--set
    train.lr=3e-4`` arrives as the string YAML 1.1 leaves it)."""
    model_config = _STRICT

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, v: Any, info: ValidationInfo) -> Any:
        ann = cls.model_fields[info.field_name].annotation
        kind = _number_kind(ann)
        if kind == "number" and isinstance(v, bool):
            said, what = str(v).lower(), info.field_name
        elif kind == "numbers" and isinstance(v, list) and any(isinstance(x, bool) for x in v):
            i = next(i for i, x in enumerate(v) if isinstance(x, bool))
            said, what = f"item {i} ({str(v[i]).lower()})", f"each item of {info.field_name}"
        elif kind == "number":
            return _as_written(v, _whole_kind(ann))
        elif kind == "numbers" and isinstance(v, list):
            return [_as_written(x, _whole_kind(ann)) for x in v]
        else:
            return v
        raise ValueError(f"{said} is a yes/no where a number belongs (YAML reads yes and on as true, no and off as "
                         f"false, and pydantic would take them as 1 and 0); write {what} as a number")


SEED_MAX = 2**32 - 1
"""numpy takes seeds in [0, 2**32); torch and Python's random take that range too."""


def _seed_in_range(v: int) -> int:
    if not 0 <= v <= SEED_MAX:
        raise ValueError(f"seed {v} is outside 0..{SEED_MAX} (what torch, numpy and random all accept); "
                         f"pick a seed between 0 and {SEED_MAX}")
    return v


Seed = Annotated[int, AfterValidator(_seed_in_range)]


def _a_size(v: str) -> str:
    try:
        parse_size(v)
    except BadInput as e:  # the key's path is pydantic's
        raise ValueError(f"{e.detail}; {e.fix}") from None
    return v


def _size_text(v: Any) -> Any:
    """A number written for a size (``memory_per_gpu: 80``) read as its text, so the size's own check says what is
    wrong with it (no unit) instead of "not a valid string"."""
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


Size = Annotated[str, BeforeValidator(_size_text), AfterValidator(_a_size)]
"""A memory size as users write it: 24GiB, 512MiB, 1.5GB (checked when the campaign is read, not when it is used)."""


def _nonzero_alpha(v: float) -> float:
    if v == 0:
        raise ValueError("alpha 0 scales the adapter's output by alpha / r = 0: its product never reaches the model, "
                         "so nothing it learns changes a prediction and its gradients are 0; set alpha (e.g. 2 × r)")
    return v


def _some_modules(v):
    if v == []:
        raise ValueError("an empty list adapts no module, so the adapter would train nothing; name the modules "
                         "(e.g. [q_proj, v_proj]), write all-linear, or remove the key for peft's choice")
    return v


def _some_days(v: list[int]) -> list[int]:
    if not v or len(set(v)) != len(v):
        raise ValueError(f"{v} {'plans no rental' if not v else 'lists a length twice'}: the sheet packs the runs "
                         "into each rental length once; list distinct lengths in days, e.g. [3, 7, 30]")
    return v


class AdapterConfig(Section):
    kind: Literal["lora"] = "lora"
    """Adapter kind; LoRA through peft."""
    r: PositiveInt = 8
    """LoRA rank."""
    alpha: Annotated[float, AfterValidator(_nonzero_alpha)] = 16.0
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA branch."""
    target_modules: Annotated[list[str] | Literal["all-linear"] | None, AfterValidator(_some_modules)] = None
    """Module names to adapt, e.g. [q_proj, v_proj]; all-linear adapts every linear layer but the output head;
    null lets peft pick for known architectures."""
    merged_copy: bool = False
    """Also export the base model with the adapter merged in (artifact/merged, full size); the adapter
    alone (artifact/adapter) is always exported, and checkpoints hold only the trainable parameters."""


class QuantizationConfig(Section):
    bits: Literal[4, 8] = 4
    """4 (bitsandbytes Linear4bit: QLoRA) or 8 (Linear8bitLt, LLM.int8()): the base's linear layers held in
    that many bits; the output head, embeddings and norms stay in model.dtype, as transformers leaves them."""
    type: Literal["nf4", "fp4"] = "nf4"
    """4-bit only: nf4 (NormalFloat, the QLoRA paper's) or fp4."""
    double_quant: bool = True
    """4-bit only: quantise the per-block absmax constants too (≈0.37 bits a weight saved)."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """4-bit only: the dtype the weights are dequantised to for each matmul, forward and backward."""

    @model_validator(mode="after")
    def _eight_bit(self) -> "QuantizationConfig":
        # a 4-bit setting away from its default (a campaign written back whole, --set included, holds the defaults)
        said = sorted(k for k in ("type", "double_quant", "compute_dtype")
                      if getattr(self, k) != type(self).model_fields[k].default)
        if self.bits == 8 and said:
            raise ValueError(f"{', '.join(said)} {'is a 4-bit setting' if len(said) == 1 else 'are 4-bit settings'}"
                             "; 8-bit (LLM.int8()) has none: remove "
                             f"{' and '.join('model.quantization.' + k for k in said)}, or set bits: 4")
        return self


class ModelConfig(Section):
    path: str | None = None
    """Local Hugging Face model directory (relative to the campaign file), or a hub id (org/name[@revision])
    found in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME); never downloads."""
    config: dict[str, Any] | None = None
    """Or a transformers config dict (with model_type) for random initialisation."""
    tokenizer: str | None = None
    """Local tokenizer directory or a cached hub id, or "byte" for the built-in byte-level tokenizer; default
    model.path."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype the weights are held in."""
    adapter: AdapterConfig | None = None
    """Parameter-efficient adapter, e.g. {kind: lora, r: 8, alpha: 16, target_modules: [q_proj, v_proj]}."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Allow model code shipped in the model directory to run. Off unless set; recorded in the journal."""
    quantization: QuantizationConfig | None = None
    """A quantised base for QLoRA (bitsandbytes, ``pip install 'pilotrun[qlora]'``; needs model.adapter), e.g.
    {bits: 4, type: nf4, double_quant: true, compute_dtype: bfloat16}: loaded as transformers'
    BitsAndBytesConfig loads it, prepared as peft's prepare_model_for_kbit_training prepares it."""
    config_overrides: dict[str, Any] | None = None
    """Keys set on the model's config before it is built or loaded, e.g. {output_router_logits: true,
    router_aux_loss_coef: 0.02} to train a mixture of experts' router loss as Axolotl's model_config does."""


def _names_not_booleans(v: Any) -> Any:
    """data.labels' names as written: YAML reads false, true, no, yes, off and on unquoted as booleans, whose spelling
    is lost (pydantic said "Input should be a valid string")."""
    if isinstance(v, list):
        i = next((i for i, x in enumerate(v) if isinstance(x, bool)), None)
        if i is not None:
            raise ValueError(f"item {i} ({str(v[i]).lower()}) is a yes/no: YAML reads false, true, no, yes, off and on "
                             "unquoted as booleans; quote each class name as the data writes it (\"false\", "
                             "\"true\")")
    return v


def _plain_template(v: str | None) -> str | None:
    """data.prompt: a field's name, or a template of ``{field}`` placeholders with ``{{`` and ``}}`` for literal braces;
    nothing more of Python's format language, which the prompt is rendered with. Left to ``str.format`` a brace that
    does not pair (a prompt quoting code) was exit 3, ``{q!r}`` trained on the field's repr, ``{q:d}`` was exit 3 at
    the first record and ``{q:>999999999}`` padded every prompt to a GB (the pilot was killed for memory), all after
    ``validate`` said ok; JSON quoted in the prompt (``{"a": 1}``) read as a field named '"a"'."""
    if not v:
        return v
    literal = "to write a brace in the prompt, double it ({{ or }})"
    try:
        parts = list(string.Formatter().parse(v))
    except ValueError as e:
        raise ValueError(f"its braces do not pair ({e}); a placeholder is {{field}}, and {literal}") from None
    for _, name, spec, conv in parts:
        why = _not_plain(name, spec, conv) if name is not None else None
        if why:
            shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"the placeholder {shown} {why}; write a placeholder as {{field}} alone, and {literal}")
    return v


def _not_plain(name: str, spec: str, conv: str | None) -> str | None:
    """What a placeholder of a prompt template does beyond naming a field, or None."""
    if not name.strip() or name.isdigit():
        return "names no field (a positional placeholder)"
    if conv:
        return f"converts the field (!{conv}" + (
            ": its repr, quotes and escapes, would be in the prompt)" if conv in ("r", "a") else ")")
    if spec:
        return f"formats the field (:{spec}: a width or a format code), where the prompt takes its text as it is"
    if any(c in name for c in ".["):
        return "reads an attribute or an item of the field ('.' or '[')"
    return None


class DataConfig(Section):
    train: str | None = None
    """Training records (.jsonl .json .csv .parquet; the first three also .gz .bz2 .xz), relative to the campaign
    file."""
    validation: str | None = None
    """Validation records, same formats."""
    test: str | None = None
    """Test records, same formats (optional)."""
    prompt: Annotated[str | None, AfterValidator(_plain_template)] = None
    """causal-lm and preference: the prompt field, or a template over fields such as "Q: {question}\\nA: " (a literal
    brace written {{ or }}); "" for no prompt (completion: the whole response field is in the loss)."""
    response: str | None = None
    """causal-lm: the response field: the only tokens in the loss."""
    messages: str | None = None
    """causal-lm chat: field holding [{role, content}]; loss on assistant turns only. preference: the conversation
    before the two answers (data.prompt's chat form)."""
    chosen: str | None = None
    """preference: the preferred response field: text, an assistant turn {role, content}, or a list of messages
    (a whole conversation whose shared beginning with data.rejected is the prompt)."""
    rejected: str | None = None
    """preference: the dispreferred response field, in the same form as data.chosen."""
    chat_template: str = "auto"
    """causal-lm chat format: auto (the tokenizer's own chat template, else plain) | model (the tokenizer's
    template, required) | plain ("role: content" lines) | a Jinja template, inline or a .jinja file."""
    text: str | None = None
    """seq-cls: the text field."""
    label: str | None = None
    """seq-cls: the label field (a class name or an id)."""
    labels: Annotated[list[str] | None, BeforeValidator(_names_not_booleans)] = None
    """seq-cls: ordered class names; id i means labels[i]."""
    group_by: str | None = None
    """Leakage unit (conversation, patient, source document ...): a field of each record."""
    period_by: str | None = None
    """Optional time field: validation/test must not precede train."""
    max_length: PositiveInt = 256
    """Tokens per example after truncation (from the right); with data.packing, tokens per packed row."""
    packing: bool = False
    """causal-lm: pack several examples into each row of up to data.max_length tokens (Axolotl's sample_packing,
    TRL's packing); positions restart and attention stays within each example, and the worst case is a full row."""


class StopConfig(Section):
    on_nan: bool = True
    """Stop as diverged when a loss is NaN or infinite."""
    diverge_factor: float | None = Field(3.0, gt=1.0)
    """Stop as diverged when the training loss exceeds this factor times the first update's loss."""
    patience: PositiveInt | None = None
    """Stop after this many validations without improvement of the plan metric; null never stops."""


class TrainConfig(Section):
    micro_batch: PositiveInt = 2
    """Examples per forward/backward pass, per rank."""
    accumulation: PositiveInt = 8
    """Forward/backward passes per optimizer update."""
    precision: Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"] = "fp32"
    """fp32 | bf16-mixed | fp16-mixed (with a grad scaler) | bf16-true (weights and math in bf16)."""
    optimizer: Literal["adamw", "sgd", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"] = "adamw"
    """adamw | sgd (torch's) | adamw_8bit | paged_adamw_8bit | paged_adamw_32bit (bitsandbytes', as QLoRA pairs them:
    8-bit moments in blocks, and on CUDA paged state in unified memory, outside the allocator's count)."""
    lr: float = Field(1.0e-4, ge=0.0)
    """Peak learning rate."""
    weight_decay: float = Field(0.0, ge=0.0)
    """Decoupled weight decay (AdamW) or L2 (SGD)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate shape after warmup."""
    warmup: int = Field(0, ge=0)
    """Updates of linear warmup from 0 to lr."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value; null disables clipping."""
    updates: PositiveInt | None = 200
    """The budget in optimizer updates (or give epochs instead)."""
    epochs: float | None = Field(None, gt=0.0)
    """The budget in passes over the training set; when set, updates must be null."""
    drop_last: bool = True
    """Drop the last partial update of each epoch (true) or train on it with fewer examples (false)."""
    eval_every: PositiveInt = 20
    """Updates between validations, fixed before launch."""
    eval_batch: PositiveInt = 8
    """Examples per evaluation batch."""
    save_every: PositiveInt | None = 50
    """Updates between checkpoints; null saves only at the end."""
    keep_checkpoints: PositiveInt | None = None
    """Keep the last N numbered checkpoints, plus the best by plan.metric and final; null keeps all."""
    stop: StopConfig = Field(default_factory=StopConfig)
    """Stop rules, declared before launch."""
    strategy: Literal["single", "ddp", "fsdp"] = "single"
    """single | ddp | fsdp."""
    nproc: PositiveInt = 1
    """Processes (ranks) on this machine; launched through torch.distributed."""

    @model_validator(mode="after")
    def _budget(self) -> "TrainConfig":
        if self.epochs is not None and self.updates is not None and "updates" in self.model_fields_set:
            raise ValueError("give train.updates or train.epochs, not both; set the other to null")
        if self.epochs is not None:
            self.updates = None
        if self.updates is None and self.epochs is None:
            raise ValueError("no budget; set train.updates (optimizer updates) or train.epochs")
        if self.strategy == "single" and self.nproc > 1:
            raise ValueError(
                f"train.nproc={self.nproc} with train.strategy=single; set train.strategy: ddp (or fsdp)"
            )
        return self


class PlanConfig(Section):
    metric: str = "val_loss"
    """The metric the comparison is decided on."""
    goal: Literal["minimize", "maximize"] = "minimize"
    """Whether lower or higher is better."""
    control: dict[str, Any] = Field(default_factory=dict)
    """Overrides of the control run, as dotted keys."""
    variants: list[dict[str, Any]] = Field(default_factory=list)
    """Each variant's overrides, as dotted keys; only what the experiment compares."""
    seeds: list[Seed] = Field(default_factory=lambda: [0])
    """Seeds every arm runs with."""


class HardwareConfig(Section):
    memory_per_gpu: Size = "80GiB"
    """Memory of one target GPU, e.g. 24GiB, 80GiB."""
    gpus: PositiveInt = 1
    """GPUs in the rental."""
    rental_days: Annotated[list[PositiveInt], AfterValidator(_some_days)] = Field(default_factory=lambda: [3, 7, 30])
    """Rental lengths to plan for."""
    reserve: float = Field(0.2, ge=0.0, lt=1.0)
    """Share of each rental kept for evaluation and export."""


class PreferenceConfig(Section):
    loss: Literal["dpo", "ipo", "simpo", "orpo"] = "dpo"
    """The preference loss, each offline (no generation during training): dpo (the sigmoid loss of DPO on the
    log-ratios to the reference) | ipo (the squared loss of IPO on per-token log-ratios) | simpo (SimPO: per-token
    log-probabilities against a target margin, no reference) | orpo (ORPO: the chosen answer's NLL plus the
    odds-ratio term, no reference)."""
    beta: float | None = Field(None, gt=0.0)
    """The loss's β: dpo the reward scale (default 0.1), ipo τ (default 0.1), simpo the reward scale (default 2.0),
    orpo λ, the odds-ratio term's weight (default 0.1); null takes the loss's default."""
    gamma: float = Field(0.5, ge=0.0)
    """simpo only: γ, the target reward margin (TRL's simpo_gamma); the loss compares β·margin − γ."""
    reference: Literal["auto", "copy", "adapter", "precomputed", "none"] = "auto"
    """What the policy is compared with (dpo, ipo): copy (a frozen copy of the starting model, resident beside
    it) | adapter (the model with its LoRA adapter disabled: no second copy; needs model.adapter) | precomputed
    (the starting model's log-probabilities of every pair, computed once before training and stored with each
    checkpoint under the pairs' fingerprint: no reference model resident, no reference forward in a step; TRL's
    precompute_ref_log_probs) | none (simpo, orpo) | auto (adapter under LoRA, else copy; none for simpo and orpo)."""


class NotCarriedSetting(Section):
    key: str
    """The source's key (``datasets[0].type``, ``sample_packing`` ...)."""
    value: str
    """Its value in the source, as JSON (shortened)."""
    effect: str
    """What leaving it out does to the rehearsal's figures."""
    until: str | None = None
    """A campaign key that settles it once set (``val_set_size``: ``data.validation``); then it is not said."""


class ImportedConfig(Section):
    tool: Literal["axolotl", "hf"]
    """The source's format: axolotl (an Axolotl YAML) or hf (TrainingArguments / TRL SFTConfig)."""
    file: str
    """The source config the campaign was imported from."""
    not_carried: list[NotCarriedSetting] = Field(default_factory=list)
    """The source's settings the rehearsal does not reproduce; ``all`` and the sheet say them once."""


class TrackConfig(Section):
    to: Literal["mlflow", "wandb"]
    """The team's tracker: ``train``, ``sweep`` and ``all`` log their runs to it as they go (``--track`` says the
    same for one command; ``pilotrun export`` sends what the journal already holds)."""
    uri: str | None = None
    """MLflow's tracking URI; default $MLFLOW_TRACKING_URI, else a SQLite store in the home (HOME/mlflow.db).
    W&B reads its own settings (WANDB_MODE, WANDB_DIR, WANDB_BASE_URL): offline files unless they say otherwise."""
    experiment: str | None = None
    """The MLflow experiment, or the W&B project; default the campaign's name."""


class Campaign(Section):
    name: str = "campaign"
    """A short name for the campaign."""
    seed: Seed = 0
    """Seed of the run (data order, initialisation, dropout)."""
    task: str = "causal-lm"
    """causal-lm | seq-cls | preference | "package.module:TaskClass" (Python Task API)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model and tokenizer."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Data files and what the loss sees."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Training settings."""
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)
    """task: preference: the loss family, its β and the reference model."""
    plan: PlanConfig = Field(default_factory=PlanConfig)
    """The campaign's experiment: control, variants and seeds."""
    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    """The rental being planned."""
    imported: ImportedConfig | None = None
    """Written by ``pilotrun import``: the source config and the settings of it the rehearsal does not reproduce."""
    track: TrackConfig | None = Field(None, exclude=True)
    """Live logging to the team's tracker (off by default). Where runs are logged is not part of the experiment:
    left out of the resolved config and its sha256, so turning it on keeps the campaign's pilots and sweeps."""
