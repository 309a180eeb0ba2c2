"""causal-lm: prompt → response (or chat messages), loss on the response tokens only.

Labels are IGNORE on prompt tokens and padding; the EOS token ends every response and is always a
target (even when pad == eos, because padding is masked by position, not by id).
"""

from __future__ import annotations

from typing import Any

from pilotrun.tasks import chat, common, packing
from pilotrun.tasks.base import IGNORE, Example
from pilotrun.tasks.loading import build_model, eos_id, load_hf_artifact
from pilotrun.tasks.moe import plus_router_aux


class CausalLMTask(common.CampaignTask):
    kind = "causal-lm"

    def __init__(self, campaign, tokenizer=None):
        super().__init__(campaign, tokenizer)
        self.eos = eos_id(self.tokenizer)
        self._cache: dict[str, list[int]] = {}
        self.lead, self.bos, self.chat_format, self.chat_template = common.rendering(self.tokenizer, self.c, campaign)

    # --- data -------------------------------------------------------------------------------------
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

    def pairs_templated(self) -> bool:
        """A prompt/response campaign rendered as one user turn and one assistant turn of the chat template:
        when data.chat_template names one (model, or a template) — auto keeps prompt + response as written."""
        return not self.c.data.messages and self.c.data.chat_template not in ("auto", "plain") \
            and self.chat_template is not None

    def _pair_messages(self, record) -> list[dict]:
        prompt, response = self._prompt_response(record)
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]

    def encode(self, record) -> Example:
        d = self.c.data
        if self.pairs_templated():
            ids, labels, full_targets = chat.encode_templated(self.tokenizer, self.chat_template,
                                                              self._pair_messages(record), record.where)
        elif d.messages:
            ids, labels, full_targets = self._encode_chat(record)
        else:
            prompt, response = self._prompt_response(record)
            p = self.lead + self._tok(prompt)
            r = self._tok(response) + [self.eos]
            ids, labels, full_targets = p + r, [IGNORE] * len(p) + r, len(r)
        ids, labels = ids[: d.max_length], labels[: d.max_length]
        first_target = next((i for i, t in enumerate(labels) if t != IGNORE), len(labels))
        return Example(ids, labels, record.where, group=common.group_of(record, self.c),
                       period=common.period_of(record, self.c), prompt_len=first_target,
                       target_len_full=full_targets)

    def _encode_chat(self, record) -> tuple[list[int], list[int], int]:
        d = self.c.data
        msgs = chat.messages_of(record, common.field(record, d.messages, "data.messages"), d.messages)
        if self.chat_template is not None:
            return chat.encode_templated(self.tokenizer, self.chat_template, msgs, record.where)
        ids, labels, targets = list(self.lead), [IGNORE] * len(self.lead), 0
        for m in msgs:  # plain: "role: content" lines, each assistant turn ends with EOS
            head = self._tok(f"{m['role']}: ")
            ids += head
            labels += [IGNORE] * len(head)
            body = self._tok(m["content"])
            if m["role"] == "assistant":
                body = body + [self.eos]
                ids += body
                labels += body
                targets += len(body)
            else:
                body = body + self._tok("\n")
                ids += body
                labels += [IGNORE] * len(body)
        return ids, labels, targets

    def inference_prompt(self, record) -> list[int]:
        """The ids a user feeds the model at inference for the first target: tokenizer(prompt) with the
        tokenizer's own special tokens, or the chat template up to the first assistant turn."""
        d = self.c.data
        if not d.messages and not self.pairs_templated():
            return list(self.tokenizer(common.render_prompt(record, d.prompt))["input_ids"])
        msgs = self._pair_messages(record) if self.pairs_templated() else \
            chat.messages_of(record, common.field(record, d.messages, "data.messages"), d.messages)
        first = next(k for k, m in enumerate(msgs) if m["role"] == "assistant")
        if self.chat_template is not None:
            text = self.tokenizer.apply_chat_template(msgs[:first], chat_template=self.chat_template, tokenize=False,
                                                      add_generation_prompt=True)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs[:first]) + "assistant: "
        return list(self.tokenizer(text)["input_ids"])

    def format_problem(self) -> str | None:
        """Why the campaign trains chat in a format the model will not see at inference, else None."""
        own = chat.model_template(self.tokenizer)
        if own and not self.c.data.messages and self.c.data.chat_template == "auto":
            return ("the tokenizer ships a chat template but the campaign trains plain prompt + response text "
                    "(data.prompt / data.response): the model would be trained in a format it does not see at "
                    "inference")
        if not self.c.data.messages or not own or self.chat_template == own:
            return None
        used = "plain 'role: content' lines" if self.chat_template is None else "another template (data.chat_template)"
        return (f"the tokenizer ships a chat template but the campaign renders conversations as {used}: the model "
                "would be trained in a format it does not see at inference")

    # --- batches and loss -------------------------------------------------------------------------
    def collate(self, examples: list[Example]) -> dict[str, Any]:
        batch = common.pad_batch(examples, self.pad)
        if packing.packed(examples):  # data.packing: positions restart per example (tasks/packing.py)
            import torch

            batch["position_ids"] = torch.tensor(packing.position_ids(examples, batch["input_ids"].size(1)),
                                                 dtype=torch.long)
        return batch

    @staticmethod
    def inputs(batch) -> dict[str, Any]:
        """What the model is given: the padding mask; or for packed rows the restarting positions, no mask and no
        cache, so that attention stays within each example."""
        if "position_ids" in batch:
            return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def count_targets(self, batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE).sum())

    def loss(self, model, batch):
        import torch.nn.functional as F

        if "position_ids" in batch:  # packed rows: once per model, its attention keeps their examples apart
            packing.check_kept_apart(model)
        out = model(**self.inputs(batch))
        # position t predicts token t+1
        logits = out.logits[:, :-1].float()
        target = batch["labels"][:, 1:]
        total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                ignore_index=IGNORE, reduction="sum")
        # the model's forward adds coef × aux to its mean loss: as a sum over the targets, aux counts once per target
        return plus_router_aux(model, out, total, (target != IGNORE).sum())

    def predict(self, model, batch) -> list[list[int]]:
        """Greedy ids at each target position under teacher forcing."""
        logits = model(**self.inputs(batch)).logits
        pred = logits[:, :-1].argmax(-1)
        target = batch["labels"][:, 1:]
        return [pred[i][target[i] != IGNORE].tolist() for i in range(pred.size(0))]

    def targets(self, batch) -> list[list[int]]:
        target = batch["labels"][:, 1:]
        return [target[i][target[i] != IGNORE].tolist() for i in range(target.size(0))]

    # --- model and artifact -----------------------------------------------------------------------
    def build_model(self):
        return build_model(self.c, self.tokenizer, self.kind)

    def load_artifact(self, path):
        return load_hf_artifact(self.c, self.tokenizer, self.kind, path)
