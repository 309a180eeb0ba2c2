"""Offline preference configs → a ``task: preference`` campaign: Axolotl's ``rl: dpo | ipo | orpo | simpo`` with its
preference data set types, and TRL ``DPOConfig`` dicts. The rest of each file (model, adapter, batch, schedule,
precision, sharding) is read by ``axolotl.py`` and ``hf.py`` as for a supervised config; what is a preference
method's own is here, each key carried or named with what leaving it out does.

Axolotl's data set types say which fields are the prompt and the two answers (its ``prompt_strategies/dpo`` and
``orpo``): ``chat_template.default`` reads a conversation (``field_messages``) and one assistant turn per answer
(``field_chosen``, ``field_rejected``); ``chat_template.argilla`` (ORPO) two whole conversations, whose shared start
is the prompt; ``chatml.*``, ``llama3.*``, ``zephyr.*`` name a prompt and two answers as text (``PAIR_TYPES``) and
render them with the template their prefix names; a type dict (``user_defined``) names its fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotrun.campaign.importers.axolotl_data import axolotl_data, chat_template, conversations
from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.tasks.preference_loss import REFERENCE_FREE

CARRIED = {"dpo": "dpo", "ipo": "ipo", "orpo": "orpo", "simpo": "simpo"}
# Axolotl's text pair strategies: (prompt field, chosen field, rejected field); "default" picks among several
PAIR_TYPES = {
    "default": ("prompt", "chosen", "rejected"), "prompt_pairs": ("prompt", "chosen", "rejected"),
    "intel": ("question", "chosen", "rejected"), "icr": ("input", "chosen", "rejected"),
    "argilla": ("instruction", "chosen_response", "rejected_response"), "ultra": ("prompt", "chosen", "rejected"),
    "argilla_chat": (None, "chosen", "rejected"),
}
DEFAULT_PROMPTS = ("prompt", "input", "question", "instruction")  # chatml.default takes the first a record has
KNOWN_TYPES = "chat_template.default, chat_template.argilla, chatml|llama3|zephyr." + "|".join(PAIR_TYPES)
SAME_MEMORY = "loss values differ; memory and time (the same forward and backward passes) do not"
REASONS = {
    "dpo_label_smoothing": f"conservative DPO (label smoothing) is not rehearsed: the loss is plain dpo; {SAME_MEMORY}",
    "label_smoothing": f"conservative DPO (label smoothing) is not rehearsed: the loss is plain dpo; {SAME_MEMORY}",
    "dpo_use_weighting": f"WPO's weights are not rehearsed; {SAME_MEMORY}",
    "use_weighting": f"WPO's weights are not rehearsed; {SAME_MEMORY}",
    "rpo_alpha": f"RPO's NLL term on the chosen answer is not rehearsed; {SAME_MEMORY}",
    "dpo_norm_loss": f"a length-normalised dpo loss is not rehearsed; {SAME_MEMORY}",
    "ld_alpha": f"LD-DPO's down-weighting of the longer answer's tail is not rehearsed; {SAME_MEMORY}",
    "precompute_ref_batch_size": "the rehearsal precomputes train.eval_batch pairs a batch (TRL's default when this is "
                                 "unset): the precompute_reference phase's memory is that batch's, not this one's",
    "dpo_padding_free": "rows concatenated without padding in the source: memory per micro-batch there is set by the "
                        "tokens, not the longest row (the rehearsal pads)",
    "dpo_use_liger_kernel": "Liger's fused preference loss computes the logits in chunks: memory on the rental is lower "
                            "than the rehearsal's full fp32 logits of both halves",
    "use_liger_loss": "Liger's fused preference loss computes the logits in chunks: memory on the rental is lower than "
                      "the rehearsal's full fp32 logits of both halves",
    "max_prompt_len": "the source cuts the prompt to this first, then the answer; the rehearsal cuts each half (prompt "
                      "+ one answer) from the right at data.max_length",
    "max_prompt_length": "the source cuts the prompt to this first, then the answer; the rehearsal cuts each half "
                         "(prompt + one answer) from the right at data.max_length",
    "max_completion_length": "the source cuts each answer to this; the rehearsal cuts each half (prompt + one answer) "
                             "from the right at data.max_length",
    "sync_ref_model": "the source copies the policy into the reference every few hundred updates (TR-DPO); the "
                      "rehearsal's reference stays the starting model: memory the same, the loss's values differ",
    "f_divergence_type": f"another f-divergence than DPO's reverse KL; {SAME_MEMORY}",
    "disable_dropout": "the rehearsal turns dropout off in the policy and the reference, as TRL's default does",
}


def carries(value: Any) -> bool:
    """Whether Axolotl's ``rl:`` value is an offline preference method the preference task rehearses."""
    return isinstance(value, str) and value.lower() in CARRIED


def _loss_of(b: Builder, src: str, value: Any, default: str) -> str:
    """TRL's loss_type (a name or a list of them) → preference.loss; another loss is named as not carried."""
    names = [value] if isinstance(value, str) else list(value or [])
    names = [str(n) for n in names]
    if not names:
        return default
    if names == ["sigmoid"]:
        return "dpo"
    if names == ["ipo"]:
        return "ipo"
    b.skip(src, value, f"the {', '.join(names)} loss{'es' if len(names) > 1 else ''} of TRL's DPOTrainer: the "
                       f"rehearsal trains {default} (its sigmoid loss); {SAME_MEMORY}")
    return default


def _precompute(raw: dict[str, Any], b: Builder, loss: str) -> None:
    """``precompute_ref_log_probs`` (Axolotl's key, TRL's DPOConfig's) → preference.reference: precomputed; a
    reference-free loss has nothing to precompute, and a precomputing batch size other than train.eval_batch is
    named."""
    on = raw.get("precompute_ref_log_probs")
    if on is True and loss in REFERENCE_FREE:
        b.skip("precompute_ref_log_probs", on, f"{loss} compares the policy with no reference model: nothing to "
                                               "precompute")
    elif on is True:
        b.put("precompute_ref_log_probs", "preference.reference", "precomputed")
    elif on not in (None, False):
        b.skip("precompute_ref_log_probs", on, "not true or false: the reference is kept as a model (a frozen copy, "
                                               "or the base under LoRA)")
    size = raw.get("precompute_ref_batch_size")
    if size is not None and on is True and loss not in REFERENCE_FREE:
        b.skip("precompute_ref_batch_size", size, REASONS["precompute_ref_batch_size"])
    elif size is not None:
        b.skip("precompute_ref_batch_size", size, "nothing to rehearse: the reference is not precomputed")


def _skips(raw: dict[str, Any], b: Builder, used: set[str], keys) -> None:
    for k in keys:
        used.add(k)
        if k in raw and not empty(raw[k]) and raw[k] is not False:
            b.skip(k, raw[k], REASONS[k])


def axolotl(raw: dict[str, Any], b: Builder, used: set[str]) -> None:
    """``rl:`` and its keys, and the data set as a preference data set (``axolotl_data`` with ``pair_fields``)."""
    rl = str(raw["rl"]).lower()
    used.update(("rl", "rl_beta", "dpo_beta", "orpo_alpha", "simpo_gamma", "cpo_alpha", "dpo_loss_type",
                 "dpo_loss_weights", "trl"))
    b.put("rl", "task", "preference")
    loss = CARRIED[rl]
    if rl == "dpo" and raw.get("dpo_loss_type"):
        loss = _loss_of(b, "dpo_loss_type", raw["dpo_loss_type"], "dpo")
    b.put("rl", "preference.loss", loss)
    trl = raw.get("trl") if isinstance(raw.get("trl"), dict) else {}
    for key, value in (("trl.beta", trl.get("beta")), ("rl_beta", raw.get("rl_beta")),
                       ("dpo_beta", raw.get("dpo_beta")), ("orpo_alpha", raw.get("orpo_alpha"))):
        if value is not None:  # Axolotl's order: trl.beta, rl_beta, then orpo_alpha (TRL reads ORPO's λ as beta)
            b.put(key, "preference.beta", float(value))
            break
    if rl == "simpo":
        if raw.get("simpo_gamma") is not None:
            b.put("simpo_gamma", "preference.gamma", float(raw["simpo_gamma"]))
        alpha = raw.get("cpo_alpha")
        if alpha is None or float(alpha):
            b.skip("cpo_alpha", 1.0 if alpha is None else alpha,
                   f"Axolotl's simpo runs TRL's CPOTrainer, which adds the chosen answer's NLL × cpo_alpha "
                   f"({'1.0, its default' if alpha is None else alpha}); the rehearsal's simpo has no NLL term; "
                   f"{SAME_MEMORY}")
    used.update(("precompute_ref_log_probs", "precompute_ref_batch_size"))
    _precompute(raw, b, loss)
    _skips(raw, b, used, ("dpo_label_smoothing", "dpo_use_weighting", "rpo_alpha", "dpo_norm_loss",
                          "dpo_padding_free", "dpo_use_liger_kernel", "max_prompt_len"))
    axolotl_data(raw, b, used, read_fields=pair_fields)


def pair_fields(raw: dict[str, Any], b: Builder, d: dict[str, Any], src: str) -> None:
    """A preference data set's type → data.prompt (or data.messages), data.chosen, data.rejected, the template."""
    kind = d.get("type")
    if isinstance(kind, dict):
        _user_defined(b, kind, src)
        return
    name = str(kind or "")
    strategy, _, fn = name.partition(".")
    if strategy == "chat_template" and fn in ("", "default"):
        conversations(raw, b, d, src, "chat_template", "")  # data.messages, its turns' fields, the template
        for key, field in (("chosen", d.get("field_chosen")), ("rejected", d.get("field_rejected"))):
            b.put(f"{src}.field_{key}" if field else f"{src}.type", f"data.{key}", field or key,
                  "" if field else f"the strategy's default field '{key}'")
        return
    if strategy == "chat_template" and fn in ("argilla", "argilla_chat"):  # two whole conversations
        b.put(f"{src}.type", "data.chosen", "chosen", "a whole conversation; the prompt is its start")
        b.put(f"{src}.type", "data.rejected", "rejected", "a whole conversation, starting as data.chosen does")
        chat_template(raw, b, d, src)
        return
    if fn in PAIR_TYPES and strategy in ("chatml", "llama3", "zephyr"):
        prompt, chosen, rejected = PAIR_TYPES[fn]
        if fn == "default":
            first = _first_record(b, d)
            prompt = next((k for k in DEFAULT_PROMPTS if k in first), "prompt")
            chosen = "chosen" if "chosen" in first or not first else "chosen_response"
            rejected = "rejected" if "rejected" in first or not first else "rejected_response"
        if prompt:
            b.put(f"{src}.type", "data.prompt", prompt)
        b.put(f"{src}.type", "data.chosen", d.get("field_chosen") or chosen)
        b.put(f"{src}.type", "data.rejected", d.get("field_rejected") or rejected)
        b.put(f"{src}.type", "data.chat_template", "model", f"nearest to the {strategy} markers the strategy writes")
        b.skip(f"{src}.type", name, f"Axolotl writes the {strategy} markers around the prompt and the answers itself (and "
                                    "a record's system field, when it has one); the rehearsal renders them with the "
                                    "tokenizer's own chat template: token counts differ by a few per pair")
        return
    b.ask(f"{src}.type = {kind!r} does not say which fields are the prompt, the chosen and the rejected answer",
          f"use one of {KNOWN_TYPES} (or a type dict with field_prompt, field_chosen and field_rejected), or write the "
          "campaign's data.prompt, data.chosen and data.rejected yourself")


def _first_record(b: Builder, d: dict[str, Any]) -> dict:
    """The data file's first record (its fields), or {} when it cannot be read here."""
    from pilotrun.records.readers import read_records

    train = b.c["data"].get("train")
    if not train:
        return {}
    path = Path(train) if Path(train).is_absolute() else b.out.parent / train
    try:
        records = read_records(path)
    except Exception:  # noqa: BLE001 - the fields are then the strategy's first choice, said as such
        return {}
    return dict(records[0].fields) if records else {}


def _user_defined(b: Builder, kind: dict, src: str) -> None:
    prompt = kind.get("field_prompt") or "prompt"
    fmt = kind.get("prompt_format") or "{prompt}"
    template = fmt.replace("{prompt}", "{" + prompt + "}")
    if "{system}" in template:
        template = template.replace("{system}", "{" + (kind.get("field_system") or "system") + "}")
    b.put(f"{src}.type.prompt_format" if kind.get("prompt_format") else f"{src}.type.field_prompt", "data.prompt",
          template if template != "{" + prompt + "}" else prompt)
    b.put(f"{src}.type.field_chosen" if kind.get("field_chosen") else f"{src}.type", "data.chosen",
          kind.get("field_chosen") or "chosen")
    b.put(f"{src}.type.field_rejected" if kind.get("field_rejected") else f"{src}.type", "data.rejected",
          kind.get("field_rejected") or "rejected")
    for k in ("chosen_format", "rejected_format"):
        if kind.get(k) and kind[k] != "{" + k.split("_")[0] + "}":
            b.skip(f"{src}.type.{k}", kind[k], "the text the source writes around each answer is not rendered: the "
                                               "answers are trained as the fields hold them (a few tokens fewer)")


# --- TRL's DPOConfig ------------------------------------------------------------------------------------------
DPO_KEYS = ("beta", "loss_type", "loss_weights", "label_smoothing", "use_weighting", "rpo_alpha", "ld_alpha",
            "precompute_ref_log_probs", "precompute_ref_batch_size", "max_prompt_length", "max_completion_length",
            "sync_ref_model", "f_divergence_type", "disable_dropout", "use_liger_loss")


def trl_dpo(raw: dict[str, Any], b: Builder, used: set[str], same) -> None:
    """A DPOConfig dict's own keys; ``same(value, key)``: the value is the tool's default (to_dict writes every key)."""
    used.update(DPO_KEYS)
    b.put("DPOConfig (its preference keys)", "task", "preference")
    loss = _loss_of(b, "loss_type", raw.get("loss_type", ["sigmoid"]), "dpo")
    b.put("loss_type" if "loss_type" in raw else "loss_type (DPOConfig's default)", "preference.loss", loss)
    _precompute(raw, b, loss)
    if raw.get("beta") is not None:
        b.put("beta", "preference.beta", float(raw["beta"]))
    for key, field in (("prompt", "prompt"), ("chosen", "chosen"), ("rejected", "rejected")):
        b.put("DPOTrainer's data set columns", f"data.{key}", field,
              "TRL's preference columns (text or conversations); a data set whose two answers are whole conversations "
              "has no prompt column: set data.prompt to null" if key == "prompt" else "")
    for k in DPO_KEYS[2:]:
        if k.startswith("precompute_ref_"):  # carried above
            continue
        if k in raw and not empty(raw[k]) and not same(raw[k], k) and k in REASONS:
            b.skip(k, raw[k], REASONS[k])
        elif k in raw and not empty(raw[k]) and not same(raw[k], k):
            b.skip(k, raw[k], f"not rehearsed; {SAME_MEMORY}")
