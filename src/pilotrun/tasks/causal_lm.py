"""causal-lm: prompt → response (or chat messages), loss on the response tokens only.

Labels are IGNORE on prompt tokens and padding; the EOS token ends every response and is always a
target (even when pad == eos, because padding is masked by position, not by id).
"""

from __future__ import annotations

from typing import Any

from pilotrun.errors import BadInput
from pilotrun.tasks import common
from pilotrun.tasks.base import IGNORE, Example
from pilotrun.tasks.loading import build_model, eos_id, load_tokenizer, pad_id, save_hf_artifact

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


class CausalLMTask:
    kind = "causal-lm"

    def __init__(self, campaign, tokenizer=None):
        self.campaign = campaign
        self.c = campaign.campaign if hasattr(campaign, "campaign") else campaign
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.c)
        self.eos = eos_id(self.tokenizer)
        self.pad = pad_id(self.tokenizer)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        self.bos = int(bos) if bos is not None and bos != self.eos else None
        self._cache: dict[str, list[int]] = {}

    # --- data -------------------------------------------------------------------------------------
    def records(self, split: str):
        return common.read_split(self.c, split)

    def group_key(self, record) -> str | None:
        return common.group_of(record, self.c)

    def tokenize_kwargs(self) -> dict:
        return {"add_special_tokens": False}

    def _tok(self, text: str) -> list[int]:
        return list(self.tokenizer(text, **self.tokenize_kwargs())["input_ids"])

    def _prompt_response(self, record) -> tuple[str, str]:
        d = self.c.data
        return common.render_prompt(record, d.prompt), common.text_field(record, d.response, "data.response")

    def tokenized_texts(self, record) -> list[str]:
        """The texts ``encode`` gives the tokenizer for this record (``data.prefetch`` batches them)."""
        if not self.c.data.messages:
            return list(self._prompt_response(record))
        msgs = common.field(record, self.c.data.messages, "data.messages")
        return [str(m.get("content", m.get("value"))) for m in msgs if isinstance(m, dict)] \
            if isinstance(msgs, list) else []

    def encode(self, record) -> Example:
        d = self.c.data
        if d.messages:
            ids, labels, full_targets = self._encode_chat(record)
        else:
            prompt, response = self._prompt_response(record)
            p = ([self.bos] if self.bos is not None else []) + self._tok(prompt)
            r = self._tok(response) + [self.eos]
            ids, labels, full_targets = p + r, [IGNORE] * len(p) + r, len(r)
        ids, labels = ids[: d.max_length], labels[: d.max_length]
        first_target = next((i for i, t in enumerate(labels) if t != IGNORE), len(labels))
        return Example(ids, labels, record.where, group=common.group_of(record, self.c),
                       period=common.period_of(record, self.c), prompt_len=first_target,
                       target_len_full=full_targets)

    def _encode_chat(self, record) -> tuple[list[int], list[int], int]:
        msgs = common.field(record, self.c.data.messages, "data.messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadInput(f"field '{self.c.data.messages}' must be a non-empty list of {{role, content}}",
                           where=record.where, fix="give each record a list of messages")
        ids = [self.bos] if self.bos is not None else []
        labels = [IGNORE] * len(ids)
        targets = 0
        for k, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise BadInput(f"message {k} is not an object", where=record.where, fix="use {role, content}")
            role = m.get("role", m.get("from"))
            content = m.get("content", m.get("value"))
            if role is None or content is None:
                raise BadInput(f"message {k} lacks role/content (or from/value)", where=record.where,
                               fix="give every message a role and a content")
            if isinstance(content, (list, dict)) or isinstance(role, (list, dict)):
                raise BadInput(f"message {k} of field '{self.c.data.messages}' has a role or content that is a "
                               f"{type(content if isinstance(content, (list, dict)) else role).__name__}, not text",
                               where=record.where, fix="give every message a string role and a string content")
            role = ROLE_ALIASES.get(str(role), str(role))
            head = self._tok(f"{role}: ")
            ids += head
            labels += [IGNORE] * len(head)
            body = self._tok(str(content))
            if role == "assistant":
                body = body + [self.eos]
                ids += body
                labels += body
                targets += len(body)
            else:
                body = body + self._tok("\n")
                ids += body
                labels += [IGNORE] * len(body)
        if targets == 0:
            raise BadInput("conversation has no assistant turn: nothing to train on", where=record.where,
                           fix="remove the record or add the assistant's reply")
        return ids, labels, targets

    # --- batches and loss -------------------------------------------------------------------------
    def collate(self, examples: list[Example]) -> dict[str, Any]:
        return common.pad_batch(examples, self.pad)

    def count_targets(self, batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE).sum())

    def loss(self, model, batch):
        import torch.nn.functional as F

        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        # position t predicts token t+1
        logits = logits[:, :-1].float()
        target = batch["labels"][:, 1:]
        total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                ignore_index=IGNORE, reduction="sum")
        return total, (target != IGNORE).sum()

    def predict(self, model, batch) -> list[list[int]]:
        """Greedy ids at each target position under teacher forcing."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        pred = logits[:, :-1].argmax(-1)
        target = batch["labels"][:, 1:]
        return [pred[i][target[i] != IGNORE].tolist() for i in range(pred.size(0))]

    def targets(self, batch) -> list[list[int]]:
        target = batch["labels"][:, 1:]
        return [target[i][target[i] != IGNORE].tolist() for i in range(target.size(0))]

    # --- model and artifact -----------------------------------------------------------------------
    def build_model(self):
        return build_model(self.c, self.tokenizer, self.kind)

    def save_artifact(self, model, out_dir) -> list[str]:
        return save_hf_artifact(model, self.tokenizer, out_dir)

    def load_artifact(self, path):
        from pathlib import Path

        from transformers import AutoModelForCausalLM

        from pilotrun.journal.files import reading_weights

        path = Path(path)
        with reading_weights(path, "artifact"):
            if (path / "adapter_config.json").is_file():
                from peft import AutoPeftModelForCausalLM

                return AutoPeftModelForCausalLM.from_pretrained(str(path), local_files_only=True)
            return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, use_safetensors=True)
