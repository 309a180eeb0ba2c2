"""preference: a prompt with a chosen and a rejected answer; DPO and its offline kin (tasks/preference_loss.py).

One record is one pair. ``encode`` gives a ``PairExample``: the chosen half (prompt + chosen answer) as the example's
ids and labels, the rejected half in its ``meta`` (so a pair stored with a run's control predictions comes back
whole in verify's fresh process), the same prompt ids at the start of both. Each half is cut to data.max_length
from the right, as causal-lm cuts. ``collate`` concatenates: the batch's chosen halves, then its rejected halves,
all padded to the widest of either, so one forward computes both (TRL's concatenated forward); the worst case is
the pair of the longest prompt + longer answer (``PairExample.length`` is its wider half).

The loss of a pair is one number: ``loss`` returns (sum over the batch's pairs, pairs), so the loop's division by
the update's targets is a mean over its pairs. A pair counts when both halves keep a target token after the cut
(the data checks name the others).

The reference (dpo, ipo; ``preference.reference``, ``preference_loss.reference_kind``): ``copy`` builds the policy,
then keeps a frozen deep copy of it beside it (``attach_reference``): the starting model, built before any
checkpoint is loaded into the policy, so a resumed run compares with the same reference; ``adapter`` runs the
policy with its LoRA adapter disabled. Both forward under no_grad in eval mode. Dropout is off in the policy too,
as TRL's DPOTrainer turns it off by default (``disable_dropout``): at the start the policy is the reference, and the
log-ratios are exactly 0. ``precomputed`` (tasks/preference_ref.py) keeps no reference model: a table of the
starting model's log-probabilities of every pair, filled before training (``engine/loop.precompute_reference``)
and read by ``reference_logps``.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pilotrun.errors import BadInput
from pilotrun.tasks import chat, common
from pilotrun.tasks.base import IGNORE, PREFERENCE_METRICS, Example
from pilotrun.tasks.loading import build_model, eos_id, load_hf_artifact, no_dropout
from pilotrun.tasks.moe import plus_router_aux
from pilotrun.tasks.preference_loss import (MEAN_PER_TOKEN, attach_reference, beta_of, mark_reference, pair_terms,
                                            reference_kind, reference_kind_of, reference_of, unwrapped)
from pilotrun.tasks.preference_ref import ReferenceLogps, attach_table, table_of

HALVES = ("chosen", "rejected")


@dataclass
class PairExample(Example):
    """A pair: the chosen half in ``input_ids``/``labels``, the rejected half in ``meta`` (``rejected_ids``,
    ``rejected_labels``, ``rejected_full``: its answer's tokens before the cut). ``length`` is the wider half: what
    the concatenated forward pads every row of the batch to. ``n_targets`` is 1 for a pair whose halves both keep a
    target (the pair is in the loss), else 0. ``rows``: the sequences the forward computes per pair (the sheet's
    padded tokens)."""

    rows = 2  # a class attribute, not a field

    @property
    def length(self) -> int:
        return max(len(self.input_ids), len(self.meta.get("rejected_ids", ())))

    @property
    def n_targets(self) -> int:
        return int(has_targets(self.labels) and has_targets(self.meta.get("rejected_labels", ())))


def has_targets(labels) -> bool:
    return any(t != IGNORE for t in labels)


def halves(e) -> tuple[Example, Example]:
    """The two sequences of a pair as plain examples (what a causal LM sees of each)."""
    m = e.meta
    rejected = Example(list(m["rejected_ids"]), list(m["rejected_labels"]), e.rid, e.group, e.period,
                       prompt_len=min(e.prompt_len, len(m["rejected_ids"])), target_len_full=m["rejected_full"])
    chosen = Example(list(e.input_ids), list(e.labels), e.rid, e.group, e.period, prompt_len=e.prompt_len,
                     target_len_full=e.target_len_full)
    return chosen, rejected


class PreferenceTask(common.CampaignTask):
    kind = "preference"

    def __init__(self, campaign, tokenizer=None):
        super().__init__(campaign, tokenizer)
        p = self.c.preference
        self.loss_name, self.beta, self.gamma = p.loss, beta_of(p), float(p.gamma)
        self.reference = reference_kind(self.c)
        self.eos = eos_id(self.tokenizer)
        self._seen: list = []  # per loss call: the detached per-pair sums ``take_metrics`` reports
        self.lead, self.bos, self.chat_format, self.chat_template = common.rendering(self.tokenizer, self.c, campaign)

    # --- data -------------------------------------------------------------------------------------
    def tokenize_kwargs(self) -> dict:
        return {"add_special_tokens": False}

    def _tok(self, text: str) -> list[int]:  # as causal-lm tokenizes: no specials, the template writes its own
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _answer(self, record, key: str):
        name = getattr(self.c.data, key)
        value = common.field(record, name, f"data.{key}")
        if isinstance(value, (list, dict)):
            return chat.messages_of(record, value if isinstance(value, list) else [value], name)
        return common.text_field(record, name, f"data.{key}")

    def _prompt(self, record):
        """The prompt as text (data.prompt), a conversation (data.messages), or None (none, or implicit)."""
        d = self.c.data
        if d.messages:
            msgs = common.field(record, d.messages, "data.messages")
            if isinstance(msgs, str) and msgs.strip():  # one user turn, as Axolotl reads a text field_messages
                return [{"role": "user", "content": msgs}]
            if not isinstance(msgs, list) or not msgs:
                raise BadInput(f"field '{d.messages}' (named by data.messages) must be a non-empty list of "
                               "{role, content}", where=record.where, fix="give each record the conversation before "
                                                                          "the answers")
            return chat.messages_of(record, msgs, d.messages, need_assistant=False)
        if d.prompt is not None:
            return common.render_prompt(record, d.prompt)
        return None

    def parts(self, record) -> tuple[Any, Any, Any]:
        """(prompt, chosen, rejected): texts, or conversations as [{role, content}] where any part is one or the
        campaign renders prompt and answers with a chat template; an implicit prompt (two whole conversations) is
        their shared beginning."""
        prompt, chosen, rejected = self._prompt(record), self._answer(record, "chosen"), self._answer(record, "rejected")
        conversational = any(isinstance(x, list) for x in (prompt, chosen, rejected)) or self._templated_text()
        if not conversational:
            return prompt or "", chosen, rejected
        chosen, rejected = _as_turns(chosen), _as_turns(rejected)
        if prompt is None:
            k = 0
            while k < min(len(chosen), len(rejected)) - 1 and chosen[k] == rejected[k]:
                k += 1
            prompt, chosen, rejected = chosen[:k], chosen[k:], rejected[k:]
        elif isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}] if prompt else []
        if prompt and chosen[: len(prompt)] == prompt and rejected[: len(prompt)] == prompt:
            chosen, rejected = chosen[len(prompt):], rejected[len(prompt):]  # answers given with their prompt (ultra)
        for key, turns in (("chosen", chosen), ("rejected", rejected)):
            if not any(m["role"] == "assistant" for m in turns):
                raise BadInput(f"the {key} answer has no assistant turn after the prompt: nothing to compare",
                               where=record.where, fix=f"give data.{key} the assistant's answer")
        return prompt, chosen, rejected

    def _templated_text(self) -> bool:
        """Text fields rendered as a user turn and an assistant turn: when data.chat_template names a template
        (model, or one of its own) — auto keeps prompt + answer as written, as causal-lm does."""
        return self.c.data.chat_template not in ("auto", "plain") and self.chat_template is not None

    def tokenized_texts(self, record) -> list[str]:
        """The texts ``encode`` tokenizes (``data.prefetch`` batches them), for plain text pairs."""
        prompt, chosen, rejected = self.parts(record)
        return [prompt, chosen, rejected] if isinstance(chosen, str) else []

    def sequences(self, record) -> tuple[list[int], list[list[int]], list[list[int]]]:
        """(prompt ids, [chosen answer ids, its labels], [rejected answer ids, its labels]), before the cut."""
        prompt, chosen, rejected = self.parts(record)
        if isinstance(chosen, str):
            p = self.lead + self._tok(prompt)
            answers = [self._tok(a) + [self.eos] for a in (chosen, rejected)]
            return p, [answers[0], list(answers[0])], [answers[1], list(answers[1])]
        if self.chat_template is not None:
            return self._templated(record, prompt, chosen, rejected)
        return self._plain_turns(prompt, chosen, rejected)

    def _templated(self, record, prompt, chosen, rejected):
        """Prompt rendered with the generation prompt, each answer as what the whole conversation adds after it (TRL's
        way): the two halves share the prompt's ids exactly; the answers' ids are all targets."""
        def apply(msgs, gen):
            try:
                return self.tokenizer.apply_chat_template(msgs, chat_template=self.chat_template, tokenize=False,
                                                          add_generation_prompt=gen)
            except Exception as e:  # a Jinja error in the user's or the model's template is bad input
                raise BadInput(f"the chat template fails on this pair: {type(e).__name__}: {e}", where=record.where,
                               fix="fix the template (data.chat_template) or the record's roles") from None

        head = apply(prompt, True) if prompt else ""
        out = []
        for answer in (chosen, rejected):
            whole = apply(prompt + answer, False)
            if not whole.startswith(head):
                raise BadInput("the chat template renders the prompt differently inside the whole conversation, so "
                               "the answer cannot be cut from it", where=record.where,
                               fix="use a template whose rendering of the prompt is a prefix of the whole (most are), "
                                   "or data.chat_template: plain")
            ids = self._tok(whole[len(head):])
            out.append([ids, list(ids)])
        return self._tok(head), out[0], out[1]

    def _plain_turns(self, prompt, chosen, rejected):
        """No chat template: "role: content" lines, as causal-lm's plain chat; assistant turns end with EOS and are
        the targets, the prompt's included turns are not."""
        p = list(self.lead)
        for m in prompt:
            p += self._tok(f"{m['role']}: {m['content']}\n")
        out = []
        for answer in (chosen, rejected):
            ids, labels = [], []
            for m in answer:
                head = self._tok(f"{m['role']}: ")
                body = self._tok(m["content"]) + ([self.eos] if m["role"] == "assistant" else self._tok("\n"))
                ids += head + body
                labels += [IGNORE] * len(head) + (body if m["role"] == "assistant" else [IGNORE] * len(body))
            out.append([ids, labels])
        return p, out[0], out[1]

    def encode(self, record) -> PairExample:
        limit = self.c.data.max_length
        p, (c_ids, c_lab), (r_ids, r_lab) = self.sequences(record)

        def half(ids, labels):
            full = p + ids
            lab = [IGNORE] * len(p) + labels
            return full[:limit], lab[:limit], sum(1 for t in labels if t != IGNORE)

        ci, cl, cf = half(c_ids, c_lab)
        ri, rl, rf = half(r_ids, r_lab)
        common_start = next((k for k, (a, b) in enumerate(zip(c_ids, r_ids)) if a != b), min(len(c_ids), len(r_ids)))
        return PairExample(ci, cl, record.where, group=common.group_of(record, self.c),
                           period=common.period_of(record, self.c), prompt_len=min(len(p), limit), target_len_full=cf,
                           meta={"rejected_ids": ri, "rejected_labels": rl, "rejected_full": rf, "prompt_tokens": len(p),
                                 "identical": c_ids == r_ids, "common_start": common_start})

    def pairs_templated(self) -> bool:
        return self._templated_text()

    def format_problem(self) -> str | None:
        """Why the campaign trains its pairs in a format the model will not see at inference, else None."""
        own = chat.model_template(self.tokenizer)
        if own and not self.c.data.messages and self.c.data.chat_template == "auto" \
                and isinstance(self.c.data.prompt, str):
            return ("the tokenizer ships a chat template but the campaign trains plain prompt + answer text "
                    "(data.prompt / data.chosen / data.rejected): the model would be tuned in a format it does not "
                    "see at inference")
        return None

    def inference_prompt(self, record) -> list[int]:
        """The ids a user feeds the model for this prompt: tokenizer(prompt), or the template with its generation
        prompt."""
        prompt, chosen, _ = self.parts(record)
        if isinstance(chosen, str):
            return list(self.tokenizer(prompt)["input_ids"])
        return self.sequences(record)[0]

    # --- batches ------------------------------------------------------------------------------------
    def collate(self, examples: list) -> dict[str, Any]:
        """Chosen halves first, then rejected, padded to the widest row of either; ``pairs`` the pair count,
        ``pair_mask`` which pairs are in the loss (both halves keep a target)."""
        rows = [Example(e.input_ids, e.labels, e.rid) for e in examples]
        rows += [Example(e.meta["rejected_ids"], e.meta["rejected_labels"], e.rid) for e in examples]
        batch = common.pad_batch(rows, self.pad)
        has = (batch["labels"][:, 1:] != IGNORE).any(-1)
        n = len(examples)
        batch.update(rids=[e.rid for e in examples], pairs=n, pair_mask=has[:n] & has[n:])
        return batch

    def count_targets(self, batch) -> int:
        return int(batch["pair_mask"].sum())

    # --- log-probabilities, loss and what it saw -----------------------------------------------------------
    def token_logps(self, model, batch):
        """Per row, the log-probability of each target token (0 elsewhere), in fp32, and the target mask."""
        return self._forward(model, batch)[:2]

    def _forward(self, model, batch):
        """``token_logps`` and the forward's output (its router auxiliary loss, on a mixture of experts)."""
        import torch.nn.functional as F

        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        logits = out.logits[:, :-1].float()  # position t predicts token t+1; fp32 as the causal-lm loss
        target = batch["labels"][:, 1:]
        logp = -F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=IGNORE,
                                reduction="none").view(target.shape)
        return logp, target != IGNORE, out

    def _per_pair(self, logp, mask):
        """(chosen, rejected) log-probabilities per pair: summed (dpo), or the mean per token."""
        total = logp.sum(-1)
        if self.loss_name in MEAN_PER_TOKEN:
            total = total / mask.sum(-1).clamp(min=1)
        return total.chunk(2)

    def reload_loss(self, model, batch):
        """The exported artifact alone (no reference beside it): its NLL of both halves' answer tokens, the forward a
        user's reload runs (the pilot's reload phase)."""
        logp, mask = self.token_logps(model, batch)
        return -logp.sum(), mask.sum()

    def policy_logps(self, model, batch):
        return self._per_pair(*self.token_logps(model, batch))

    def reference_logps(self, model, batch):
        """(chosen, rejected) of the reference, under no_grad in eval mode; None for a reference-free loss."""
        import torch

        kind = reference_kind_of(model) or self.reference
        if kind == "none":
            return None
        if kind == "precomputed":
            return self._precomputed(model, batch)
        with torch.no_grad(), _evaluating(*self._reference_model(model, batch, kind)) as ref:
            return self._per_pair(*self.token_logps(ref, batch))

    def _precomputed(self, model, batch):
        """The stored (chosen, rejected) of the batch's pairs, as the loss wants them (sums, or means per token)."""
        import torch
        from torch._subclasses.fake_tensor import is_fake

        table = table_of(model)
        got = table.lookup(batch["rids"], batch["input_ids"].device) if table is not None else None
        if got is None:
            first = next(iter(unwrapped(model).parameters()), None)
            if first is None or not is_fake(first):
                raise RuntimeError("preference.reference: precomputed, but the reference log-probabilities of a "
                                   "pair of this batch were not computed before training (precompute_reference)")
            n = batch["pairs"]  # the estimator's probes of shapes alone: the values do not matter, their bytes do
            got = (torch.zeros(n, device=batch["input_ids"].device), torch.zeros(n, device=batch["input_ids"].device))
        chosen, rejected = got
        if self.loss_name in MEAN_PER_TOKEN:
            counts = (batch["labels"][:, 1:] != IGNORE).sum(-1).clamp(min=1).chunk(2)
            chosen, rejected = chosen / counts[0], rejected / counts[1]
        return chosen, rejected

    def precomputes_reference(self, model) -> bool:
        return (reference_kind_of(model) or self.reference) == "precomputed"

    def reference_table(self, model) -> ReferenceLogps:
        """The model's table of precomputed reference log-probabilities (a new empty one attached if it has none)."""
        table = table_of(model)
        if table is None:
            table = ReferenceLogps()
            attach_table(model, table)
        return table

    def store_reference(self, model, batch, examples) -> None:
        """The model's summed log-probabilities of both halves of ``examples`` (collated as ``batch``) into its
        table: called with the starting model, under no_grad in eval mode."""
        logp, _ = self.token_logps(model, batch)
        chosen, rejected = logp.sum(-1).chunk(2)
        self.reference_table(model).put(examples, chosen, rejected)

    def _reference_model(self, model, batch, kind: str):
        """(the module the reference forward runs, the context that makes it the reference)."""
        if kind == "adapter":
            inner = unwrapped(model)
            return inner, inner.disable_adapter()
        ref = reference_of(model)
        if ref is None:
            raise RuntimeError("preference.reference: copy, but the model carries no reference (built by "
                               "PreferenceTask.build_model)")
        device = batch["input_ids"].device
        first = next(ref.parameters(), None)
        if first is not None and first.device != device:  # the policy was moved after its build: follow it
            ref.to(device)
        return ref, _nothing()

    def loss(self, model, batch):
        logp, mask, out = self._forward(model, batch)
        policy = self._per_pair(logp, mask)
        reference = self.reference_logps(model, batch)
        terms = pair_terms(self.loss_name, self.beta, self.gamma, policy, reference)
        keep = batch["pair_mask"].to(terms.losses.device)
        self._note(terms, keep)
        # TRL's DPOTrainer adds coef × the policy forward's aux loss (both halves, one forward) to its mean over pairs
        return plus_router_aux(model, out, (terms.losses * keep).sum(), keep.sum())

    def _note(self, terms, keep) -> None:
        """Keep the batch's detached sums over its pairs in the loss: pairs, correct, margin, both rewards and both
        log-probabilities (``take_metrics``); nothing on fake tensors (the estimator's trace)."""
        import torch
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(terms.losses):
            return
        k = keep.float()
        margin = (terms.chosen_rewards - terms.rejected_rewards).float()
        self._seen.append(torch.stack([k.sum(), ((margin > 0).float() * k).sum(), (margin * k).sum(),
                                       (terms.chosen_rewards.float() * k).sum(),
                                       (terms.rejected_rewards.float() * k).sum(),
                                       (terms.chosen.detach().float() * k).sum(),
                                       (terms.rejected.detach().float() * k).sum()]).detach().cpu())
        if len(self._seen) > 256:  # losses nobody takes (a reload's, a fit probe's): kept as one running sum
            self._seen[:] = [torch.stack(self._seen).sum(0)]

    def take_metrics(self, reduce=lambda x: x) -> dict[str, float]:
        """What the loss saw since the last call (then forgotten), reduced over ranks by ``reduce``: the preference
        accuracy (share of pairs whose chosen reward is higher), the mean reward margin, the mean rewards and
        log-probabilities of each half."""
        import torch

        seen = torch.stack(self._seen).sum(0).tolist() if self._seen else [0.0] * 7
        sums = [float(reduce(v)) for v in seen]  # every rank reduces all seven, whatever it saw
        self._seen.clear()
        n = sums[0]
        if not n:
            return {}
        return {k: v / n for k, v in zip(PREFERENCE_METRICS, sums[1:])}

    # --- predictions (control predictions, verify) ----------------------------------------------------------
    def predict(self, model, batch) -> list[list[int]]:
        """Per pair, the greedy ids at the targets of its chosen half, then of its rejected half (teacher forced)."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return self._per_pair_list(logits[:, :-1].argmax(-1), batch)

    def targets(self, batch) -> list[list[int]]:
        return self._per_pair_list(batch["labels"][:, 1:], batch)

    def target_logprobs(self, model, batch) -> list:
        """Per pair, the log-probabilities (fp32, CPU) over the vocabulary at its targets: chosen half's rows, then
        rejected's (control predictions store the top ones; verify reproduces them)."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logp = logits[:, :-1].float().log_softmax(-1)
        target = batch["labels"][:, 1:]
        n = batch["pairs"]
        return [self._cat(logp[i][target[i] != IGNORE], logp[n + i][target[n + i] != IGNORE]).cpu() for i in range(n)]

    @staticmethod
    def _cat(a, b):
        import torch

        return torch.cat([a, b])

    def _per_pair_list(self, values, batch) -> list[list[int]]:
        target, n = batch["labels"][:, 1:], batch["pairs"]
        return [values[i][target[i] != IGNORE].tolist() + values[n + i][target[n + i] != IGNORE].tolist()
                for i in range(n)]

    def pair_margins(self, model, batch) -> dict[str, list[float]]:
        """Per pair (no grad): the policy's and the reference's log-probabilities of each half and the reward
        margin; overfit's memorisation check and the reference's stillness read them."""
        import torch

        with torch.no_grad(), _evaluating(model, _nothing()):
            pc, pr = self.policy_logps(model, batch)
            ref = self.reference_logps(model, batch)
            terms = pair_terms(self.loss_name, self.beta, self.gamma, (pc, pr), ref)
        out = {"chosen": pc.tolist(), "rejected": pr.tolist(),
               "margin": (terms.chosen_rewards - terms.rejected_rewards).tolist()}
        if ref is not None:
            out.update(ref_chosen=ref[0].tolist(), ref_rejected=ref[1].tolist())
        return out

    # --- model and artifact -----------------------------------------------------------------------
    def build_policy(self):
        """The policy: the causal LM of model.path/model.config (with its adapter), dropout off."""
        model = build_model(self.c, self.tokenizer, "causal-lm")
        no_dropout(model)
        return model

    def build_model(self):
        """The policy, with the frozen copy of it kept beside it when preference.reference is copy."""
        model = self.build_policy()
        if self.reference == "copy":
            attach_reference(model, copy.deepcopy(model))
        mark_reference(model, self.reference)
        return model

    def load_artifact(self, path):
        return load_hf_artifact(self.c, self.tokenizer, "causal-lm", path)


def _as_turns(answer) -> list[dict]:
    return [{"role": "assistant", "content": answer}] if isinstance(answer, str) else answer


@contextmanager
def _nothing():
    yield


@contextmanager
def _evaluating(model, context):
    """``model`` in eval mode inside ``context`` (a LoRA adapter disabled, or nothing), its mode restored after."""
    was = model.training
    model.eval()
    try:
        with context:
            yield model
    finally:
        model.train(was)


def margin_text(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    return f"{sum(finite) / len(finite):+.3f}" if finite else "n/a"
