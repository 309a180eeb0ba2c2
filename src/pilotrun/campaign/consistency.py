"""What ``validate`` checks beyond the schema: the task's needs, the files, the fields in the records."""

from __future__ import annotations

from pilotrun.campaign.arithmetic import batch_arithmetic
from pilotrun.campaign.schema import PreferenceConfig
from pilotrun.errors import BadInput, BadInputs
from pilotrun import jsonsafe
from pilotrun.records.readers import not_text, read_records
from pilotrun.tasks.common import SPLITS, missing_field_fix, template_fields
from pilotrun.tasks.hub import snapshot_of
from pilotrun.tasks.loading import (architecture_problems, check_model_dir, check_positions, folder_config_dict,
                                    no_tokenizer_folder)
from pilotrun.tasks.quantized import QLORA_EXTRA, missing_bitsandbytes
from pilotrun.tasks.base import BUILTIN_TASKS, METRIC_GOALS, validation_metrics


def task_needs(c, base_dir=None) -> list[BadInput]:
    d, problems = c.data, []
    if d.train is None:
        problems.append(BadInput("no training data", where="data.train", fix="set data.train to a .jsonl/.json/.csv/.parquet file"))
    if c.task == "causal-lm":
        if d.messages is None and (d.prompt is None or d.response is None):
            problems.append(BadInput("causal-lm needs data.prompt and data.response, or data.messages", where="data",
                                     fix="name the prompt and response fields (or a chat messages field)"))
        if d.messages is not None and (d.prompt is not None or d.response is not None):
            problems.append(BadInput("data.messages with data.prompt/response: choose one form", where="data.messages",
                                     fix="set data.prompt and data.response to null for chat data"))
        problems += _other_tasks_keys(c)
    elif c.task == "preference":
        problems += preference_needs(c)
    elif c.task == "seq-cls":
        for k in ("text", "label", "labels"):
            if getattr(d, k) is None:
                problems.append(BadInput(f"seq-cls needs data.{k}", where=f"data.{k}",
                                         fix="seq-cls needs data.text, data.label and data.labels (ordered class names)"))
        if d.labels is not None and len(set(d.labels)) != len(d.labels):
            problems.append(BadInput("data.labels has repeated names", where="data.labels", fix="list each class once"))
        elif d.labels is not None and len(d.labels) < 2:  # a softmax over one class is 1 whatever the weights
            problems.append(BadInput(f"data.labels {d.labels} names {len(d.labels) or 'no'} class"
                                     f"{'' if len(d.labels) == 1 else 'es'}: a classifier chooses among two or more "
                                     "(its loss over one class is 0 whatever it learns)", where="data.labels",
                                     fix="list every class the labels name, in the order of their ids"))
        blank = [i for i, n in enumerate(d.labels or []) if not n.strip()]
        if blank:  # [neg, pos, ""]: a trailing comma's class, which no record names
            problems.append(BadInput(f"data.labels item {blank[0]} is {d.labels[blank[0]]!r}: a class with no name",
                                     where="data.labels", fix="remove it, or name the class"))
        problems += _other_tasks_keys(c)
    if d.packing and c.task != "causal-lm":
        problems.append(BadInput(f"data.packing packs causal-lm examples into rows; this campaign is {c.task}",
                                 where="data.packing", fix="remove data.packing (or set it to false)"))
    if c.task != "preference" and c.preference != PreferenceConfig():
        problems.append(BadInput(f"preference.* is set but task is {c.task}", where="preference",
                                 fix="set task: preference, or remove the preference section"))
    problems += _task_and_model_files(c, base_dir)
    if c.task in BUILTIN_TASKS and c.model.path is None and c.model.config is None:
        problems.append(BadInput("no model", where="model", fix="set model.path (local folder) or model.config"))
    if c.model.path is not None and c.model.config is not None:
        problems.append(BadInput("model.path and model.config both set", where="model.config",
                                 fix="keep model.path to fine-tune, or model.config for random init"))
    if c.model.config is not None and c.model.tokenizer is None:
        problems.append(BadInput("model.config needs a tokenizer", where="model.tokenizer",
                                 fix="set model.tokenizer: byte, or a local tokenizer folder"))
    if c.task in BUILTIN_TASKS:
        sizes = architecture_problems(c)
        problems += sizes
        try:
            if not sizes:
                check_positions(c, defaults=False)  # config.json or model.config as written: no torch here
        except BadInput as e:
            problems.append(e)
    problems += quantization_problems(c)
    problems += folder_quantization(c)
    problems += plan_metric_problems(c)
    if c.train.precision == "bf16-true" and c.model.dtype == "float16":
        problems.append(BadInput("train.precision=bf16-true with model.dtype=float16", where="model.dtype",
                                 fix="set model.dtype: bfloat16 (or float32)"))
    if c.model.dtype == "float16" and c.model.adapter is None and c.train.precision == "fp16-mixed":
        problems.append(BadInput("model.dtype=float16 with train.precision=fp16-mixed trains the float16 weights "
                                 "themselves, and fp16-mixed's grad scaler unscales float32 gradients only (torch "
                                 "refuses float16 ones: every step fails)", where="model.dtype",
                                 fix="set model.dtype: float32 (fp16-mixed then keeps float32 weights and computes in "
                                     "float16), or train an adapter (model.adapter: float32 weights over the float16 "
                                     "base)"))
    return problems


def plan_metric_problems(c) -> list[BadInput]:
    """plan.metric against what the task's validations log, and plan.goal against the metric's direction. A name
    no validation logs would leave the sweep's comparison, the best checkpoint and the patience rule nothing to read
    (they read plan.metric alone); a goal against the metric's direction ranks the arms backwards."""
    import difflib

    metric, goal, known = c.plan.metric, c.plan.goal, validation_metrics(c.task)
    if known is None and not metric.startswith("val_"):  # a custom task logs val_loss and val_<its take_metrics>
        return [BadInput(f"{metric!r} is not a validation metric (those are val_loss and val_<name> for each name "
                         "the task's take_metrics reports): the sweep's comparison, the best checkpoint and the "
                         "patience rule would have nothing to read", where="plan.metric",
                         fix="set plan.metric: val_loss, or val_<name> for a name your task's take_metrics reports")]
    if known is not None and metric not in known:
        close = difflib.get_close_matches(metric, known, n=1, cutoff=0.5)
        return [BadInput(f"{metric!r} is not logged by a {c.task} campaign's validations (they log "
                         f"{', '.join(known)}): the sweep's comparison, the best checkpoint and the patience rule "
                         "would have nothing to read" + (f"; did you mean {close[0]}?" if close else ""),
                         where="plan.metric", fix=f"set plan.metric: {close[0] if close else known[0]}"
                         + (f" (or another of {', '.join(known)})" if len(known) > 1 else ""))]
    want = METRIC_GOALS.get(metric)
    if want is not None and goal != want:
        return [BadInput(f"{goal} with plan.metric {metric}: a {'lower' if want == 'minimize' else 'higher'} {metric} "
                         "is better, so the comparison would call the worse arm better", where="plan.goal",
                         fix=f"set plan.goal: {want}")]
    return []


def folder_quantization(c) -> list[BadInput]:
    """A model folder whose config.json says its weights are quantised (``quantization_config``: a bitsandbytes
    4-bit base saved for QLoRA, as the hub's -bnb-4bit copies are; GPTQ, AWQ, FP8 ...). transformers loads it
    quantised whatever the campaign says: with model.quantization null a LoRA campaign trained on a 4-bit base the
    campaign does not name, and a full fine-tune trained the few layers left unquantised (norms, embeddings) and said
    ok; an FP8 folder trained on the CPU. A bitsandbytes folder under model.quantization is compared with what is built
    (tasks/quantized.check_quantized)."""
    from pathlib import Path

    if c.model.path is None or c.task not in BUILTIN_TASKS:
        return []
    path = Path(c.model.path) / "config.json"
    qc = (folder_config_dict(path.parent) or {}).get("quantization_config")  # unreadable: the folder's checks say so
    if not isinstance(qc, dict):
        return []
    method = str(qc.get("quant_method") or "an unnamed method")
    bits = 4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else None
    if method == "bitsandbytes" and bits is not None:
        if c.model.quantization is not None:
            return []
        held = "{bits: 8}" if bits == 8 else (
            f"{{bits: 4, type: {qc.get('bnb_4bit_quant_type', 'fp4')}, double_quant: "
            f"{str(bool(qc.get('bnb_4bit_use_double_quant'))).lower()}, compute_dtype: "
            f"{str(qc.get('bnb_4bit_compute_dtype') or 'float32').removeprefix('torch.')}}}")
        trains = ("a full fine-tune of it trains only the layers left unquantised (norms, embeddings)"
                  if c.model.adapter is None else "the rehearsal would train on a base the campaign does not name")
        return [BadInput(f"the model folder holds weights bitsandbytes quantised to {bits} bits ({path}: "
                         f"quantization_config), and model.quantization is null: {trains}", where="model.quantization",
                         fix=f"set model.quantization: {held} (what the folder holds)"
                             + (" and model.adapter (e.g. {kind: lora, r: 16}): a quantised base trains through an "
                                "adapter only" if c.model.adapter is None else "")
                             + ", or point model.path at the unquantised model")]
    return [BadInput(f"the model folder holds weights quantised by {method} ({path}: quantization_config); pilotrun "
                     "rehearses unquantised bases, and bitsandbytes' 4- and 8-bit ones (model.quantization), only",
                     where="model.path", fix="point model.path at the unquantised model it was made from (with "
                                             "model.quantization: {bits: 4} and model.adapter for QLoRA on it)")]


def quantization_problems(c) -> list[BadInput]:
    """model.quantization against the rest of the campaign, without importing torch or bitsandbytes."""
    import importlib.util

    q = c.model.quantization
    problems = []
    if c.train.optimizer in ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit") and \
            importlib.util.find_spec("bitsandbytes") is None:
        problems.append(BadInput(f"train.optimizer {c.train.optimizer} is bitsandbytes', which is not installed in "
                                 "this environment", where="train.optimizer",
                                 fix=f"{QLORA_EXTRA}, or set train.optimizer: adamw"))
    if q is None:
        return problems
    said = f"model.quantization (bits: {q.bits})"
    if c.task not in BUILTIN_TASKS:
        problems.append(BadInput(f"{said} with the custom task {c.task}: its build_model loads the model itself",
                                 where="model.quantization", fix="load the base with BitsAndBytesConfig in your "
                                 "task's build_model and remove model.quantization"))
    if c.model.adapter is None:
        problems.append(BadInput(f"{said} without model.adapter: a {q.bits}-bit base is frozen (bitsandbytes' "
                                 "quantised weights take no gradient), so nothing would train",
                                 where="model.quantization / model.adapter",
                                 fix="add model.adapter (e.g. {kind: lora, r: 16, alpha: 32}) for QLoRA, or remove "
                                     "model.quantization to train the full model"))
    if c.train.strategy == "fsdp":
        problems.append(BadInput(
            f"{said} with train.strategy fsdp: FSDP shards bitsandbytes' 4-bit weights only when they are stored "
            "in the compute dtype (bnb_4bit_quant_storage: bfloat16, as FSDP-QLoRA loads them, rank 0 quantising "
            "and broadcasting), and 8-bit weights not at all; pilotrun rehearses a quantised base on one rank or "
            "replicated (ddp)", where="train.strategy",
            fix="set train.strategy: ddp (each rank holds the whole quantised base) or single, or remove "
                "model.quantization to rehearse FSDP"))
    if importlib.util.find_spec("bitsandbytes") is None:
        problems.append(missing_bitsandbytes())
    return problems


# the data keys each built-in task reads (preference's own are checked in preference_needs)
TASK_KEYS = {"causal-lm": ("prompt", "response", "messages"), "seq-cls": ("text", "label", "labels")}
_OWNER = {"prompt": "causal-lm and preference", "messages": "causal-lm and preference", "response": "causal-lm",
          "chosen": "preference", "rejected": "preference", "text": "seq-cls", "label": "seq-cls", "labels": "seq-cls"}


def _other_tasks_keys(c) -> list[BadInput]:
    """A data key of another task set in a causal-lm or seq-cls campaign: that task's field, read by nothing here
    (``data.chosen`` on causal-lm trained on data.response alone, without a word: a preference campaign missing its
    ``task: preference``)."""
    out = []
    for k, owner in _OWNER.items():
        if k not in TASK_KEYS[c.task] and getattr(c.data, k) is not None:
            out.append(BadInput(f"data.{k} is a {owner} key; this campaign is {c.task}, which does not read it",
                                where=f"data.{k}", fix=f"remove data.{k}, or set task: {owner.split(' and ')[0]}"))
    return out


def preference_needs(c) -> list[BadInput]:
    """A preference campaign's keys: both answers, one form of prompt, no other task's keys, a reference its loss
    and its strategy can use."""
    d, p, out = c.data, c.preference, []
    for k in ("chosen", "rejected"):
        if getattr(d, k) is None:
            out.append(BadInput(f"preference needs data.{k}", where=f"data.{k}",
                                fix="name the fields of the preferred (data.chosen) and dispreferred (data.rejected) "
                                    "answers"))
    if d.messages is not None and d.prompt is not None:
        out.append(BadInput("data.messages with data.prompt: choose one form of prompt", where="data.messages",
                            fix="keep data.prompt (text) or data.messages (the conversation before the answers)"))
    for k in ("response", "text", "label", "labels"):
        if getattr(d, k) is not None:
            out.append(BadInput(f"data.{k} is not a preference key", where=f"data.{k}",
                                fix=f"remove data.{k}: a preference pair is data.prompt (or data.messages), data.chosen "
                                    "and data.rejected"))
    free = p.loss in ("simpo", "orpo")
    if free and p.reference not in ("auto", "none"):
        out.append(BadInput(f"preference.reference: {p.reference} with preference.loss: {p.loss}, which uses no "
                            "reference model", where="preference.reference",
                            fix="remove preference.reference (or set it to none), or use loss dpo or ipo"))
    if not free and p.reference == "none":
        out.append(BadInput(f"preference.loss: {p.loss} compares the policy with a reference model, and "
                            "preference.reference is none", where="preference.reference",
                            fix="set preference.reference: auto (a frozen copy, or the base under LoRA), copy or "
                                "adapter; or use loss simpo or orpo, which need none"))
    if p.reference == "adapter" and c.model.adapter is None:
        out.append(BadInput("preference.reference: adapter needs a LoRA adapter to disable (model.adapter)",
                            where="preference.reference",
                            fix="set model.adapter (e.g. {kind: lora, r: 8}), or preference.reference: copy"))
    held = p.reference if p.reference != "auto" else ("none" if free else "adapter" if c.model.adapter else "copy")
    if c.train.strategy == "fsdp" and held in ("copy", "adapter", "precomputed"):
        what = {"copy": "copied beside the policy", "adapter": "as the base under a disabled adapter",
                "precomputed": "precomputed by the starting model"}[held]
        out.append(BadInput(f"train.strategy: fsdp with the reference model {what}: pilotrun does not rehearse a "
                            "reference model's forward on FSDP shards", where="train.strategy",
                            fix="set train.strategy: ddp, or preference.loss: simpo or orpo (no reference model)"))
    return out


def fields_named(c) -> list[tuple[str, str]]:
    """(field, key) pairs every record must have."""
    d, out = c.data, []
    if c.task == "causal-lm":
        if d.messages:
            out.append((d.messages, "data.messages"))
        else:
            names = template_fields(d.prompt or "") if d.prompt else None
            out += [(n, "data.prompt") for n in (names or ([d.prompt] if d.prompt else []))]
            if d.response:
                out.append((d.response, "data.response"))
    elif c.task == "preference":
        if d.messages:
            out.append((d.messages, "data.messages"))
        elif d.prompt:
            out += [(n, "data.prompt") for n in (template_fields(d.prompt) or [d.prompt])]
        out += [(d.chosen, "data.chosen"), (d.rejected, "data.rejected")]
    elif c.task == "seq-cls":
        out += [(d.text, "data.text"), (d.label, "data.label")]
    for key in ("group_by", "period_by"):
        if getattr(d, key):
            out.append((getattr(d, key), f"data.{key}"))
    return [(f, k) for f, k in out if f]


def check_records(c) -> dict[str, int]:
    """Read every data file and check each record has the named fields. Returns records per split."""
    counts, problems = {}, []
    need = fields_named(c) if c.task in BUILTIN_TASKS else []
    for split in SPLITS:
        path = getattr(c.data, split)
        if path is None:
            continue
        try:
            records = read_records(path, f"data.{split}")
        except BadInput as e:
            problems.append(e)
            continue
        counts[split] = len(records)
        for f, key in need:
            missing = [r for r in records if f not in r.fields]
            if missing:
                present = ", ".join(sorted(missing[0].fields))
                problems.append(BadInput(
                    f"{len(missing)} of {len(records)} records have no field '{f}' (named by {key}); "
                    f"fields present: {present}", where=missing[0].where,
                    fix=missing_field_fix(f, key, missing[0].fields)))
                continue
            bad = _not_readable(records, f, key)
            if bad:
                problems.append(BadInput(bad[0], where=bad[1], fix=bad[2]))
                continue
            if key in ("data.response", "data.text", "data.chosen", "data.rejected"):
                empty = [r for r in records if not str(r.fields[f] if r.fields[f] is not None else "").strip()]
                if empty:
                    problems.append(BadInput(
                        f"field '{f}' (named by {key}) is empty in {len(empty)} of {len(records)} records",
                        where=empty[0].where, fix="remove those records or give them a value; an empty target trains nothing"))
    if problems:
        raise BadInputs(problems) if len(problems) > 1 else problems[0]
    return counts


def _not_readable(records, f: str, key: str) -> tuple[str, str, str] | None:
    """(message, where, fix) for the first record whose field ``f`` the task cannot read as what ``key`` names, the
    records counted: a text or label that is a list, an object, NaN or an infinity (it would train "nan" or a repr,
    or fail at train); a conversation (data.messages, or a preference answer given as turns) that is no list of
    {role, content} with text in them."""
    from pilotrun.tasks.chat import messages_of

    if key in ("data.group_by", "data.period_by"):
        return None  # any value is a group's name

    def why(r) -> str | None:
        value = r.fields[f]
        turns = key == "data.messages" or (key in ("data.chosen", "data.rejected") and isinstance(value, (list, dict)))
        if not turns:
            return not_text(value)
        try:
            messages_of(r, value if not isinstance(value, dict) else [value], f, need_assistant=key != "data.messages")
        except BadInput as e:
            return e.detail
        return None

    bad = [(r, w) for r in records if (w := why(r)) is not None]
    if not bad:
        return None
    (r, w), n = bad[0], f"{len(bad)} of {len(records)} records"
    if key == "data.messages" or w.startswith(("field", "message", "conversation")):
        return (f"field '{f}' (named by {key}) is no conversation the task can read in {n}: {w}", r.where,
                "give each record a list of {role, content} with text in them: fix or drop those records")
    what = "a label" if key == "data.label" else "text"
    if key == "data.label" and w == "a list":  # [0, 2]: HF's problem_type multi_label_classification
        from pilotrun.tasks.seq_cls import MULTI_LABEL_FIX, ONE_CLASS

        return (f"field '{f}' (named by {key}) is a list, not a label, in {n}: several classes a record (multi-label "
                f"classification), {ONE_CLASS}", r.where, MULTI_LABEL_FIX)
    return (f"field '{f}' (named by {key}) is {w}, not {what}, in {n}", r.where,
            f"give '{f}' {'a label' if what == 'a label' else 'a string'} in every record (a number is read as text; "
            "NaN, lists and objects are not): fix or drop those records")


def check_consistency(c, base_dir=None) -> None:
    """``base_dir``: the campaign's folder, where a custom task module may live (make_task imports from it)."""
    problems = task_needs(c, base_dir)
    if problems:
        raise BadInputs(problems) if len(problems) > 1 else problems[0]


def _task_and_model_files(c, base_dir=None) -> list[BadInput]:
    """The task name, model folder, tokenizer folder and model_type, checked without importing torch."""
    import importlib.util
    from pathlib import Path

    problems = []
    if c.task not in BUILTIN_TASKS:
        module, sep, cls = c.task.partition(":")
        if not sep or not module or not cls:
            problems.append(BadInput(f"unknown task '{c.task}'", where="task",
                                     fix="use causal-lm, seq-cls, preference or a Python task as package.module:Class"))
        else:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            top = module.split(".")[0]
            if not found and base_dir is not None:
                found = (Path(base_dir) / f"{top}.py").is_file() or (Path(base_dir) / top / "__init__.py").is_file()
            if not found:
                problems.append(BadInput(f"cannot import '{module}'", where="task",
                                         fix="put the module next to the campaign file, install it, or add its "
                                             "folder to PYTHONPATH"))
        return problems
    if c.model.path is not None:
        try:
            check_model_dir(Path(c.model.path), weights=snapshot_of(c.model.path) is None)
        except BadInput as e:
            problems.append(e)
    tok = c.model.tokenizer
    if tok not in (None, "byte") and not Path(tok).is_dir():
        problems.append(no_tokenizer_folder(Path(tok)))
    if c.model.config is not None and not c.model.config.get("model_type"):
        problems.append(BadInput("model.config has no model_type", where="model.config",
                                 fix="add model_type (e.g. llama, gpt2, bert) to model.config"))
    return problems


BYTE_TOKENIZER_SIZE = 384  # ByT5Tokenizer(): 3 specials, 256 bytes, 125 extra ids (tests/test_vocabulary.py checks it)


def _tokenizer_size(spec) -> tuple[int, str] | None:
    """(ids the tokenizer can give: its largest id + 1, where that was read), without importing
    transformers: the built-in byte tokenizer, or a folder's tokenizer.json (its model's vocabulary and
    added tokens) or vocab.txt. None when the folder holds neither (a SentencePiece model file)."""
    from pathlib import Path

    if spec == "byte":
        return BYTE_TOKENIZER_SIZE, "the byte tokenizer"
    folder = Path(spec)
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            t = jsonsafe.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # the tokenizer load says what is wrong with the file
        vocab = (t.get("model") or {}).get("vocab") or {}
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))  # Unigram: a list
        ids += [a["id"] for a in t.get("added_tokens") or [] if isinstance(a, dict) and isinstance(a.get("id"), int)]
        ids = [i for i in ids if isinstance(i, int)]
        return (max(ids) + 1, str(path)) if ids else None
    path = folder / "vocab.txt"
    if path.is_file():
        return sum(1 for _ in path.open(encoding="utf-8")), str(path)
    return None


def _model_vocab(c) -> tuple[int, str] | None:
    """(model's vocabulary size, the key it came from): model.config's vocab_size or config.json's."""
    from pathlib import Path

    if c.model.config is not None:
        n = c.model.config.get("vocab_size")
        return (n, "model.config.vocab_size") if isinstance(n, int) else None
    path = Path(c.model.path) / "config.json"
    try:
        n = jsonsafe.loads(path.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return (n, f"vocab_size in {path}") if isinstance(n, int) else None


def vocabulary_problem(c) -> list[BadInput]:
    """A tokenizer that gives ids the model's embedding has no row for (an index error at the first step)."""
    spec = c.model.tokenizer or c.model.path
    if spec is None or (c.model.config is None and c.model.path is None):
        return []
    tok, model = _tokenizer_size(spec), _model_vocab(c)
    if tok is None or model is None or tok[0] <= model[0]:
        return []
    where = "model.config" if c.model.config is not None else "model.path"
    return [BadInput(f"the tokenizer has {tok[0]} tokens but the model's embedding has {model[0]} rows ({tok[1]} "
                     f"gives ids 0..{tok[0] - 1}; {model[1]} is {model[0]}): ids {model[0]}..{tok[0] - 1} have no "
                     "embedding row", where=where,
                     fix=f"set the model's vocab_size to at least {tok[0]}, or use the tokenizer the model was "
                         "trained with (or resize the embeddings and save the model)")]


def check_campaign(loaded) -> tuple[dict[str, int], dict]:
    """What ``validate`` refuses, raised as BadInput: schema-level consistency, the vocabulary, every record, the
    batch arithmetic. Returns the records per split and the arithmetic (``sweep`` calls it before freezing a plan)."""
    c = loaded.campaign
    check_consistency(c, loaded.base_dir)
    for problem in vocabulary_problem(c):  # validate's own: the verbs that build the model refuse it there
        raise problem
    counts = check_records(c)
    return counts, batch_arithmetic(c.train, counts.get("train", 0), {} if c.data.packing else None)
