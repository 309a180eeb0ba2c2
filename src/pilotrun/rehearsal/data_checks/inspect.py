"""inspect: examples exactly as the loss sees them, and the data-set-wide checks over every split."""

from __future__ import annotations

from dataclasses import asdict

from pilotrun.campaign.prepare import adapter_choice, adapted_router, prepare
from pilotrun.console.progress import note
from pilotrun.data.checks import run_checks
from pilotrun.data.pairs import SWAP_MIN, SWAP_SAMPLE, mean_logps, reference_preference
from pilotrun.data.labels import head_name
from pilotrun.errors import BadInput
from pilotrun.tasks import common
from pilotrun.tasks.base import IGNORE
from pilotrun.tasks.chat import FIX_FORMAT
from pilotrun.tasks.preference_loss import MEAN_PER_TOKEN
from pilotrun.verdicts import Check, StageResult, plural

INFO_CHECKS = ("classes", "chat format", "lora targets", "swapped-pairs")  # ok checks whose message is worth printing


def inspect(loaded, n: int = 0, split: str | None = None) -> StageResult:
    """Run the checks; with ``n`` > 0, also the first n examples of ``split`` token by token in ``data``."""
    task = prepare(loaded, splits=()).task
    report = run_checks(task, loaded)
    if getattr(task, "kind", None) == "preference":
        report.checks.append(swapped_pairs(task, loaded))
    fmt = format_check(task, loaded)
    if fmt is not None:
        report.checks.insert(0, fmt)
    report.checks[:0] = pair_checks(task, loaded)

    lora = adapter_choice(loaded)
    if lora is not None:
        router = adapted_router(loaded)
        said = f"LoRA adapts {', '.join(lora[0])} ({lora[1]})" + (f"; {router}" if router else "")
        report.checks.insert(0, Check("lora targets", "warn" if router else "ok", said))
    shown = [c for c in report.checks if c.verdict != "ok" or c.name in INFO_CHECKS]
    messages = [c.line() for c in shown]
    for s in report.splits.values():
        what = (f"{plural(s['examples'], 'pair')} ({s['sequences']} sequences)" if "sequences" in s
                else plural(s["examples"], "example"))
        messages.append(f"{s['split']}: {what}, length {s['min']}..{s['max']} (median "
                        f"{s['median']}), {s['at_max_length']} at data.max_length; max_length {s['keep_99']} keeps "
                        f"99% of {s.get('keeps', 'targets')}, {s['keep_100']} all; lengths "
                        f"0..{loaded.campaign.data.max_length} "
                        f"|{s['histogram']}|")
    n_ex = sum(s["examples"] for s in report.splits.values())
    fails = sum(c.verdict == "fail" for c in report.checks)
    warns = sum(c.verdict == "warn" for c in report.checks)
    unit = "pairs" if getattr(task, "kind", None) == "preference" else "examples"
    summary = (f"{n_ex} {unit} in {plural(len(report.splits), 'split')} through task.encode: "
               + ("every check passed" if not fails and not warns else
                  f"{fails} failing, {warns} warning{'s' if warns != 1 else ''}"))
    data = {"checks": [asdict(c) for c in report.checks], "splits": report.splits}
    if n:
        data["examples"] = view_examples(task, loaded, split or "train", n)
    columns = ["split", "examples", "min", "median", "max", "at_max_length", "keep_99", "keep_100"]
    return StageResult("inspect", report.verdict, summary, messages, data, columns, list(report.splits.values()))


PAIR_FIX = ("give the records as conversations (data.messages), or set data.chat_template: model to render each "
            "prompt and response as a user and an assistant turn of the model's template")
SEPARATOR_SAMPLE = 2000  # records read for the separator check: the format is the campaign's, one record shows it


def pair_checks(task, loaded) -> list:
    """Plain prompt/response (a preference pair's prompt and chosen answer alike): a warning when the model ships a
    chat template, and when prompt and response meet with no separator, a letter running into a letter (the model
    cannot tell where its answer starts)."""
    d = loaded.campaign.data
    kind = getattr(task, "kind", None)
    if d.messages or kind not in ("causal-lm", "preference") or not hasattr(task, "format_problem"):
        return []
    answer, what = (d.chosen, "chosen answer") if kind == "preference" else (d.response, "response")
    out = []
    problem = task.format_problem()
    if problem:
        out.append(Check("prompt format", "warn", f"{problem}; fix: {PAIR_FIX}"))
    if getattr(task, "pairs_templated", lambda: False)() or d.prompt is None or answer is None:
        return out
    joined, n = [], 0
    for r in task.records("train")[:SEPARATOR_SAMPLE]:
        prompt = common.render_prompt(r, d.prompt)
        response = r.fields.get(answer)
        n += 1
        if not isinstance(response, str):  # an assistant turn or a conversation: the template separates it
            continue
        if prompt and response and prompt[-1].isalpha() and response[0].isalpha():  # "what" + "The": one word
            joined.append((r.where, prompt, response))
    if joined:
        where, prompt, response = joined[0]
        out.append(Check("prompt separator", "warn", (
            f"{len(joined)} of {n} train records' prompt and {what} meet with no separator: the prompt's last word "
            f"and the {what}'s first run into one, e.g. {where}: …{prompt[-24:]!r} + {response[:24]!r}…; the model "
            "cannot tell where the answer starts; "
            "fix: end data.prompt with a separator (a template such as \"{question}\\n\\n\" or \"Q: {question}\\nA: \"), or "
            "set data.chat_template: model")))
    return out


def format_check(task, loaded):
    """Which chat format the conversations are trained in; fails when the model ships another one."""
    fmt = getattr(task, "chat_format", None)
    if not loaded.campaign.data.messages or fmt is None:
        return None
    problem = task.format_problem() if hasattr(task, "format_problem") else None
    if problem:
        return Check("chat format", "fail", f"{problem}; fix: {FIX_FORMAT}")
    what = {"model": "the tokenizer's own chat template", "explicit": "the template of data.chat_template",
            "plain": "plain 'role: content' lines (the tokenizer has no chat template)"}[fmt]
    return Check("chat format", "ok", f"conversations rendered with {what}; loss on assistant turns only")


def view_examples(task, loaded, split: str, n: int) -> list[dict]:
    """The first n examples of a split: each token with what the loss does with it, from task.collate."""
    records = task.records(split)
    if not records:
        raise BadInput(f"the campaign has no {split} split", where=f"data.{split}",
                       fix="choose --split train, validation or test, whichever the campaign sets")
    if getattr(task, "kind", None) == "preference":
        return view_pairs(task, records[:n])
    examples = [task.encode(r) for r in records[:n]]
    batch = task.collate(examples)
    ids, mask = batch["input_ids"].tolist(), batch["attention_mask"].tolist()
    labels = batch["labels"].tolist()
    tok = task.tokenizer
    c = loaded.campaign
    out = []
    for i, e in enumerate(examples):
        token_level = isinstance(labels[i], list)
        kinds = []
        for p, t in enumerate(ids[i]):
            if not mask[i][p]:
                kinds.append("padding")
            elif not token_level:
                kinds.append("input")  # seq-cls: every token is input, the label is the example's class
            elif labels[i][p] != IGNORE:
                kinds.append("trained")
            else:
                kinds.append("masked")
        item = {"rid": e.rid, "tokens": [[t, piece, k] for t, piece, k in zip(ids[i], pieces(tok, ids[i]), kinds)],
                "attention_mask": mask[i]}
        if token_level:
            if hasattr(task, "inference_prompt"):
                item["vs_inference"] = vs_inference(e.input_ids, task.inference_prompt(records[i]), tok)
            item["prompt"] = tok.decode(e.input_ids[: e.prompt_len])
            item["trained"] = tok.decode([t for t in e.labels if t != IGNORE])
        else:
            cid = int(labels[i])
            names = c.data.labels or []
            item.update(text=tok.decode(e.input_ids, skip_special_tokens=True), label_id=cid,
                        label=names[cid] if 0 <= cid < len(names) else None, head_label=head_name(c, cid))
        out.append(item)
    if token_level and c.data.packing:
        out.append(view_packed_row(task, examples, c.data.max_length))
    return out


def view_packed_row(task, examples: list, max_length: int) -> dict:
    """data.packing: the first row the examples pack into, as the loss sees it, with where each example starts."""
    from pilotrun.tasks.packing import pack

    row = pack(examples, max_length)[0]
    batch = task.collate([row])
    ids, labels, pos = batch["input_ids"][0].tolist(), batch["labels"][0].tolist(), batch["position_ids"][0].tolist()
    kinds = ["trained" if y != IGNORE else "masked" for y in labels]
    starts = [p for p, q in enumerate(pos) if q == 0]
    said = (f"a packed row of {plural(len(starts), 'example')} ({' + '.join(map(str, row.meta['segments']))} of up to "
            f"{max_length} tokens): positions restart at 0 at tokens {', '.join(str(p + 1) for p in starts)}; no "
            "attention mask, so attention stays within each example; each example's first token is masked (the "
            "previous example's end never predicts it)")
    return {"rid": f"packed row ({row.rid})", "tokens": [[t, piece, k] for t, piece, k in zip(ids, pieces(task.tokenizer, ids),
                                                                                       kinds)],
            "attention_mask": [1] * len(ids), "position_ids": pos, "packed": said}


def view_pairs(task, records: list) -> list[dict]:
    """Each pair as the concatenated forward sees it: its chosen and its rejected sequence, padded to the wider, each
    token trained (the answer: in that half's log-probability), masked (the shared prompt) or padding, and what each
    half adds to the loss."""
    tok, out = task.tokenizer, []
    mean = task.loss_name in MEAN_PER_TOKEN
    for r in records:
        e = task.encode(r)
        batch = task.collate([e])
        ids, mask, labels = batch["input_ids"].tolist(), batch["attention_mask"].tolist(), batch["labels"].tolist()
        diff = e.meta.get("common_start", 0)
        for k, (half, sign) in enumerate((("chosen", "+"), ("rejected", "−"))):
            kinds = ["padding" if not mask[k][p] else "trained" if labels[k][p] != IGNORE else "masked"
                     for p in range(len(ids[k]))]
            answer = [t for t, y in zip(ids[k], labels[k]) if y != IGNORE]
            full = e.target_len_full if k == 0 else e.meta["rejected_full"]
            cut = f", {full - len(answer)} cut by data.max_length" if len(answer) < full else ""
            contributes = (f"{half}: {plural(len(answer), 'answer token')}{cut} give log π({half}), "
                           f"{'their mean' if mean else 'summed'}; it enters the margin with {sign}; the "
                           f"{plural(e.prompt_len, 'prompt token')} are the same in both halves and masked; the answers "
                           + ("are identical" if e.meta.get("identical") else f"first differ at answer token {diff + 1}"))
            out.append({"rid": f"{e.rid} ({half})", "tokens": [[t, piece, kd] for t, piece, kd in
                                                               zip(ids[k], pieces(tok, ids[k]), kinds)],
                        "attention_mask": mask[k], "prompt": tok.decode(ids[k][: e.prompt_len]),
                        "trained": tok.decode(answer), "half": half, "contributes": contributes})
    return out


def swapped_pairs(task, loaded) -> Check:
    """The starting model's preference on up to SWAP_SAMPLE train pairs (``data/pairs.reference_preference``)."""
    import torch

    if loaded.campaign.model.path is None:
        return Check("swapped-pairs", "ok", "not read: model.config builds random weights, which prefer no answer "
                     "(the check reads a pretrained model.path)", "train")
    pairs = [e for e in (task.encode(r) for r in task.records("train")[:SWAP_SAMPLE]) if e.n_targets]
    if len(pairs) < SWAP_MIN:
        return reference_preference(pairs, [])
    note(f"the starting model reads {plural(len(pairs), 'train pair')} (swapped-pairs check)", log=True)
    torch.manual_seed(loaded.campaign.seed)
    model = task.build_policy()
    means = mean_logps(task, model, pairs, loaded.campaign.train.eval_batch, torch.device("cpu"))
    return reference_preference(pairs, means)


def vs_inference(ids: list[int], prompt: list[int], tok) -> str:
    """Where the example's start differs from the ids a user feeds at inference (tokenizer(prompt))."""
    for k, (a, b) in enumerate(zip(ids, prompt)):
        if a != b:
            return (f"differs from the inference prompt ({len(prompt)} tokens) at token {k}: the example has "
                    f"{tok.decode([a])!r} ({a}), the inference prompt {tok.decode([b])!r} ({b})")
    if len(prompt) > len(ids):
        return f"the example ends inside the inference prompt ({len(ids)} of its {len(prompt)} tokens)"
    return f"starts exactly like the inference prompt ({len(prompt)} tokens, special tokens as the tokenizer adds them)"


def pieces(tok, ids: list[int]) -> list[str]:
    """The text each token adds to the decoded sequence, its leading space included: word boundaries show
    for every tokenizer kind (WordPiece drops the space from a single token's decode, BPE keeps it)."""
    out, before = [], ""
    for k in range(len(ids)):
        now = tok.decode(ids[: k + 1], clean_up_tokenization_spaces=False)
        out.append(now[len(before):] if now.startswith(before) else tok.decode([ids[k]]))
        before = now
    return out
