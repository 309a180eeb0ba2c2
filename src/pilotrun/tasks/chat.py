"""Chat records rendered the way the model will see them at inference, loss on assistant turns only.

``data.chat_template`` chooses the format: ``auto`` (the tokenizer's own chat template when it has one,
else ``plain``), ``model`` (the tokenizer's template, required), ``plain`` (``role: content`` lines, for
tokenizers without a template) or an explicit Jinja template (inline, or a ``.jinja`` file beside the
campaign). The assistant spans are located in the rendered text as TRL's assistant-only loss does
without generation tags: the conversation up to turn k with the generation prompt is a prefix of the
conversation through turn k, and what lies between is the assistant's turn (its end-of-turn marker
included). Tokens whose characters fall in an assistant span are the targets.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.errors import BadInput, utf8_of
from pilotrun.records.readers import not_text
from pilotrun.tasks.base import IGNORE

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}
FIX_FORMAT = "set data.chat_template: auto (the model's own template), or remove the key"


def model_template(tokenizer) -> str | None:
    """The chat template the tokenizer ships (tokenizer_config.json or chat_template.jinja), if any."""
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):  # several named templates: the default one
        t = t.get("default") or next(iter(t.values()), None)
    return t or None


def resolve(c, tokenizer, base_dir=None) -> tuple[str, str | None]:
    """(format, template): format is "model", "explicit" or "plain"; template the Jinja text used."""
    key = c.data.chat_template
    own = model_template(tokenizer)
    if key == "auto":
        return ("model", own) if own else ("plain", None)
    if key == "model":
        if not own:
            raise BadInput("data.chat_template: model, but the tokenizer has no chat template",
                           where="data.chat_template",
                           fix="use plain (role: content lines) or give a Jinja template (inline or a .jinja file)")
        return "model", own
    if key == "plain":
        return "plain", None
    if key.endswith(".jinja") and "{" not in key:
        path = Path(key) if Path(key).is_absolute() or base_dir is None else Path(base_dir) / key
        if not path.is_file():
            raise BadInput(f"chat template file not found: {path}", where="data.chat_template",
                           fix="point at a .jinja file (relative to the campaign file) or write the template inline")
        return "explicit", utf8_of(path.read_bytes(), path)
    return "explicit", key


def messages_of(record, msgs, name: str = "messages", *, need_assistant: bool = True) -> list[dict]:
    """The record's conversation as [{role, content}] (ShareGPT from/value and role aliases mapped); without
    ``need_assistant`` a conversation with no assistant turn is accepted (a preference pair's prompt)."""
    if not isinstance(msgs, list) or not msgs:
        raise BadInput(f"field '{name}' must be a non-empty list of {{role, content}}", where=record.where,
                       fix="give each record a list of messages")
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise BadInput(f"message {k} is not an object", where=record.where, fix="use {role, content}")
        role, content = m.get("role", m.get("from")), m.get("content", m.get("value"))
        if role is None or content is None:
            raise BadInput(f"message {k} lacks role/content (or from/value)", where=record.where,
                           fix="give every message a role and a content")
        parts = isinstance(content, list) and content and all(isinstance(x, dict) and "type" in x for x in content)
        if parts:  # [{type: text, text: ...}]: what the record holds is no text the rehearsal renders as the tool would
            kinds = ", ".join(dict.fromkeys(str(x["type"]) for x in content))
            raise BadInput(f"message {k} of field '{name}' has its content as a list of parts (type {kinds}: OpenAI's "
                           "and the multimodal form), not text; join its text parts into one string (an image "
                           "part is no input of a text model)", where=record.where,
                           fix="write each message's content as one string: the text of its parts joined")
        bad = not_text(content) or not_text(role)
        if bad is not None:
            raise BadInput(f"message {k} of field '{name}' has a role or content that is {bad}, not text",
                           where=record.where, fix="give every message a string role and a string content")
        out.append({"role": ROLE_ALIASES.get(str(role), str(role)), "content": str(content)})
    if need_assistant and not any(m["role"] == "assistant" for m in out):
        roles = list(dict.fromkeys(m["role"] for m in out))
        near = [r for r in roles if r.strip().lower() in ("assistant", *(k for k, v in ROLE_ALIASES.items()
                                                                              if v == "assistant"))]
        raise BadInput(f"conversation has no assistant turn: nothing to train on (its roles: {', '.join(roles)})"
                       + (f"; roles are read as written, and {near[0]!r} is not 'assistant'" if near else ""),
                       where=record.where, fix=f"write the role as 'assistant' (the data's {near[0]!r})" if near
                       else "remove the record or add the assistant's reply")
    return out


def render(tokenizer, template: str, msgs: list[dict], where: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    def apply(m, gen):
        try:
            return tokenizer.apply_chat_template(m, chat_template=template, tokenize=False,
                                                 add_generation_prompt=gen)
        except Exception as e:  # a Jinja error in the user's or the model's template is bad input
            raise BadInput(f"the chat template fails on this conversation: {type(e).__name__}: {e}", where=where,
                           fix="fix the template (data.chat_template) or the record's roles") from None

    full = apply(msgs, False)
    spans = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before, through = apply(msgs[:k], True), apply(msgs[: k + 1], False)
        if not (through.startswith(before) and full.startswith(through)):
            raise BadInput("the chat template renders a conversation differently from its beginning, so the "
                           "assistant turns cannot be located", where=where,
                           fix="use a template whose rendering of the first turns is a prefix of the whole "
                               "(most are), or data.chat_template: plain")
        spans.append((len(before), len(through)))
    if spans and all(a == b for a, b in spans):  # every assistant turn rendered as nothing: no token to train on
        turn = next(m["content"] for m in msgs if m["role"] == "assistant")
        shown = turn if len(turn) <= 60 else turn[:57] + "..."
        raise BadInput(f"the chat template renders none of the conversation's assistant turns (the first, {shown!r}, "
                       "adds no text to the conversation before it): nothing to train on", where=where,
                       fix="use the template the model is served with, one that writes the assistant's replies (or "
                           "data.chat_template: auto for the tokenizer's own)")
    return full, spans


def encode_templated(tokenizer, template: str, msgs: list[dict], where: str) -> tuple[list[int], list[int], int]:
    """(ids, labels, target count): the rendered text tokenized as at inference (the template writes any
    BOS itself), labels on the tokens of assistant spans."""
    text, spans = render(tokenizer, template, msgs, where)
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        inside = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
    else:  # no offsets: tokenize the pieces between span edges (edges fall on turn markers)
        ids, inside, cut = [], [], 0
        for a, b in spans + [(len(text), len(text))]:
            for piece, flag in ((text[cut:a], False), (text[a:b], True)):
                if piece:
                    part = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
                    ids += part
                    inside += [flag] * len(part)
            cut = b
    labels = [t if flag else IGNORE for t, flag in zip(ids, inside)]
    return ids, labels, sum(inside)
