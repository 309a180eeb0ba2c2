"""Data-set-wide checks on what the loss sees: every record of every split, through ``task.encode``.

Streaming: each example is encoded, reduced to a few numbers and dropped, so memory grows with the
number of records, never with the number of tokens. Verdicts are data (:class:`Check`); the stage
turns them into a result.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from pilotrun.console.progress import note
from pilotrun.data.labels import label_checks, label_forms, scan_labels
from pilotrun.data.mixup import MixupScan
from pilotrun.data.pairs import PairScan
from pilotrun.data.prefetch import batched, warmed
from pilotrun.data.unknown import UnknownScan
from pilotrun.tasks import make_task
from pilotrun.tasks.base import IGNORE
from pilotrun.tasks.common import SPLITS, template_fields
from pilotrun.tasks.preference import halves
from pilotrun.verdicts import FEW, Check, worst

NOTE_EVERY = 1000  # records between two progress notes while encoding

BARS = "▁▂▃▄▅▆▇█"


@dataclass
class Report:
    checks: list[Check]
    splits: dict[str, dict[str, Any]]

    @property
    def verdict(self) -> str:
        return worst(c.verdict for c in self.checks)


def sparkline(values, bins: int = 24, top: int | None = None) -> str:
    v = np.asarray(values)
    if v.size == 0:
        return ""
    hi = max(int(top if top is not None else v.max()), 1)
    counts, _ = np.histogram(v, bins=bins, range=(0, hi))
    peak = counts.max() or 1
    return "".join(" " if n == 0 else BARS[min(len(BARS) - 1, int(n * len(BARS) / (peak + 1)))] for n in counts)


def keep_length(need, share: float) -> int:
    """The smallest max_length under which ``share`` of the examples keep all their targets."""
    s = np.sort(np.asarray(need))
    return int(s[max(0, math.ceil(share * s.size) - 1)]) if s.size else 0


def _special(task, name: str) -> int | None:
    v = getattr(task, name, None)
    if v is None and getattr(task, "tokenizer", None) is not None:
        v = getattr(task.tokenizer, f"{name}_token_id", None)
    return int(v) if v is not None else None


def _ids(rids: list[str]) -> str:
    return ", ".join(rids[:FEW]) + (" …" if len(rids) > FEW else "")


class SplitScan:
    """Per-example numbers of one split; ``add`` sees each (record, example) once."""

    def __init__(self, task, max_length: int):
        self.eos, self.pad, self.bos = _special(task, "eos"), _special(task, "pad"), getattr(task, "bos", None)
        if self.pad is None:
            self.pad = self.eos
        self.max_length = max_length
        self.n = 0
        self.token_level = True
        self.length, self.need, self.digest = array("i"), array("i"), array("Q")
        self.rids: list[str] = []
        self.prompt_pos: list[str] = []
        self.echo: list[str] = []
        self.no_target: list[str] = []
        self.untrained: list[str] = []  # no target, and not for max_length's cut (a custom task's encode masks all)
        self.cut: list[tuple[str, int]] = []
        self.pad_trained: list[str] = []
        self.reencode: list[tuple[int, Any]] = []
        self.with_eos = 0
        self.with_targets = 0
        self.classes: dict[int, int] = {}

    def add(self, record, e, half: int | None = None) -> None:
        """``half``: which sequence of a preference pair ``e`` is (``tasks.preference.halves``), else None."""
        i = self.n
        self.n += 1
        self.rids.append(e.rid)
        ids = np.asarray(e.input_ids, dtype=np.int64)
        lab = np.asarray(e.labels, dtype=np.int64)
        self.length.append(ids.size)
        self.digest.append(int.from_bytes(hashlib.blake2b(ids.tobytes() + b"|" + lab.tobytes(),
                                                          digest_size=8).digest(), "little"))
        if lab.size != ids.size:  # one label per example: classification
            self.token_level = False
            for c in e.labels:
                self.classes[int(c)] = self.classes.get(int(c), 0) + 1
            self.need.append(ids.size)
            if ids.size >= self.max_length:
                self.reencode.append((i, record, half))
            return
        tgt = lab != IGNORE
        n_t = int(tgt.sum())
        if n_t:
            self.with_targets += 1
        if e.prompt_len and tgt[: e.prompt_len].any():
            self.prompt_pos.append(e.rid)
        trained = lab[tgt]
        if self.eos is not None and n_t and (trained == self.eos).any():
            self.with_eos += 1
        if self.pad is not None and n_t and self._pad_in_labels(lab, tgt):
            self.pad_trained.append(e.rid)
        if n_t:
            first = int(tgt.argmax())
            rest = tgt[first:]
            end = first + (int((~rest).argmax()) if not rest.all() else rest.size)
            span, prompt = lab[first:end], ids[:first]
            if span.size and span[-1] == self.eos:
                span = span[:-1]
            if prompt.size and self.bos is not None and prompt[0] == self.bos:
                prompt = prompt[1:]
            if span.size and np.array_equal(span, prompt):
                self.echo.append(e.rid)
        full = e.target_len_full
        if n_t == 0 and (not full or ids.size < self.max_length):  # no target, and max_length cut nothing
            self.untrained.append(e.rid)
        elif full and n_t == 0:
            self.no_target.append(e.rid)
        elif full and n_t < full:
            self.cut.append((e.rid, full - n_t))
        if full and n_t < full:
            self.need.append(0)
            self.reencode.append((i, record, half))
        else:
            self.need.append(int(np.flatnonzero(tgt)[-1]) + 1 if n_t else ids.size)

    def _pad_in_labels(self, lab, tgt) -> bool:
        trained_pad = tgt & (lab == self.pad)
        if self.pad != self.eos:
            return bool(trained_pad.any())
        # pad == eos: one trained EOS ends a turn; two in a row is padding in the labels
        return bool((trained_pad[1:] & trained_pad[:-1]).any())

    def finish(self, full_task, split: str = "") -> None:
        """Measure the untruncated length of the examples max_length cut, to suggest a max_length: encoded again
        without the cut, the tokenizer served in batches as the first pass was (one call per text took as long as
        that whole pass where half the examples were cut)."""
        records = [record for _, record, _ in self.reencode]
        with batched(full_task) as warm:
            for k, ((i, record, half), _) in enumerate(zip(self.reencode, warmed(records, warm))):
                if k % NOTE_EVERY == 0:
                    note(f"measuring {split} examples data.max_length cut: {k:,}/{len(records):,}", done=k,
                         total=len(records))
                self._measure(full_task, i, record, half)

    def _measure(self, full_task, i: int, record, half) -> None:
        e = full_task.encode(record)
        if half is not None:
            e = halves(e)[half]
        lab = np.asarray(e.labels)
        if lab.size == len(e.input_ids):
            t = np.flatnonzero(lab != IGNORE)
            self.need[i] = int(t[-1]) + 1 if t.size else len(e.input_ids)
        else:
            self.need[i] = len(e.input_ids)
            if len(e.input_ids) > self.max_length:
                self.cut.append((self.rids[i], len(e.input_ids) - self.max_length))


def config_checks(c) -> list[Check]:
    d = c.data
    if c.task != "causal-lm" or not d.prompt or not d.response:
        return []
    prompt_fields = template_fields(d.prompt) or [d.prompt]
    if d.response in prompt_fields:
        return [Check("prompt-in-loss", "fail",
                      f"data.response '{d.response}' is also a prompt field (data.prompt '{d.prompt}'): the loss "
                      "trains the model to repeat its prompt; set data.response to the answer field")]
    return []


def split_checks(split: str, s: SplitScan, c, pairs: PairScan | None = None) -> tuple[list[Check], dict[str, Any]]:
    """``pairs``: a preference split's pair scan, whose truncation and duplicate checks replace the sequences'."""
    out: list[Check] = []
    n = max(s.n, 1)
    length = np.asarray(s.length)
    need = np.asarray(s.need)
    stats = {"split": split, "examples": s.n, "min": int(length.min()), "median": int(np.median(length)),
             "max": int(length.max()), "at_max_length": int((length >= s.max_length).sum()),
             "keep_99": keep_length(need, 0.99), "keep_100": keep_length(need, 1.0),
             "histogram": sparkline(length, top=s.max_length),
             "keeps": "targets" if s.token_level else "texts whole"}  # keep_99 keeps 99% of these
    if pairs is not None:
        stats.update(examples=pairs.n, sequences=s.n, keeps="answers")
    if s.token_level:
        if s.prompt_pos:
            out.append(Check("prompt-in-loss", "fail", f"{len(s.prompt_pos)} of {s.n} examples have a target at a "
                             f"prompt position (label ≠ -100 before the response), e.g. {_ids(s.prompt_pos)}", split,
                             {"count": len(s.prompt_pos), "ids": s.prompt_pos[:FEW]}))
        if s.echo:
            share = len(s.echo) / n
            out.append(Check("prompt-in-loss", "fail" if share >= 0.5 else "warn",
                             f"{len(s.echo)} of {s.n} examples ({share:.1%}) train on a copy of their prompt (the "
                             f"trained tokens equal the prompt's), e.g. {_ids(s.echo)}; is data.response the prompt "
                             "field?", split, {"count": len(s.echo), "share": share, "ids": s.echo[:FEW]}))
        if s.no_target and pairs is None:
            share = len(s.no_target) / n
            out.append(Check("truncation", "fail", f"{len(s.no_target)} of {s.n} examples ({share:.1%}) have no "
                             f"target left after truncation to data.max_length={s.max_length}, e.g. "
                             f"{_ids(s.no_target)}; data.max_length={stats['keep_99']} keeps 99% of the targets, "
                             f"{stats['keep_100']} keeps all", split,
                             {"count": len(s.no_target), "share": share, "ids": s.no_target[:FEW]}))
        if s.untrained and pairs is None:
            share = len(s.untrained) / n
            out.append(Check("no-target", "fail" if len(s.untrained) == s.n else "warn",
                             f"{len(s.untrained)} of {s.n} examples ({share:.1%}) have no target at all (every "
                             f"label is -100, and data.max_length cut nothing): they cost their compute and teach "
                             f"nothing, e.g. {_ids(s.untrained)}; does the task's encode mask the answer too?", split,
                             {"count": len(s.untrained), "share": share, "ids": s.untrained[:FEW]}))
        partly = s.cut if pairs is None else []  # examples with no target left are not in it
        if partly:
            worst_loss = max(k for _, k in partly)
            out.append(Check("truncation", "warn", f"{len(partly)} of {s.n} answers are partly cut by data.max_length="
                             f"{s.max_length} (the largest loses {worst_loss} target tokens), e.g. "
                             f"{_ids([r for r, _ in partly])}; data.max_length={stats['keep_99']} keeps 99% of the "
                             f"targets whole, {stats['keep_100']} keeps all", split,
                             {"count": len(partly), "largest_loss": worst_loss}))
        if s.pad_trained:
            out.append(Check("padding-in-labels", "fail", f"{len(s.pad_trained)} of {s.n} examples train on padding "
                             f"(pad id {s.pad} is a target), e.g. {_ids(s.pad_trained)}; mask padded positions with "
                             "-100", split, {"count": len(s.pad_trained), "ids": s.pad_trained[:FEW]}))
        if s.eos is not None and s.with_targets and s.with_eos == 0:
            why = (f"; pad == eos (id {s.eos}): masking padding by id masks EOS too, mask it by position instead"
                   if s.pad == s.eos else "")
            out.append(Check("eos-trained", "fail", f"EOS (id {s.eos}) is never a target in {split}: the model will "
                             f"not learn to stop{why}", split, {"eos": s.eos, "pad": s.pad}))
    elif s.cut:
        out.append(Check("truncation", "warn", f"{len(s.cut)} of {s.n} texts are cut by data.max_length={s.max_length} "
                         f"(the largest loses {max(k for _, k in s.cut)} tokens), e.g. {_ids([r for r, _ in s.cut])}; "
                         f"data.max_length={stats['keep_99']} keeps 99% whole, {stats['keep_100']} keeps all",
                         split, {"count": len(s.cut)}))
    if pairs is not None:
        out += pairs.checks(split)
    elif split == "train":
        digest = np.asarray(s.digest, dtype=np.uint64)
        uniq, first, counts = np.unique(digest, return_index=True, return_counts=True)
        dup = s.n - uniq.size
        if dup:
            d0 = uniq[counts > 1][0]
            where = [s.rids[i] for i in np.flatnonzero(digest == d0)[:FEW]]
            out.append(Check("duplicates", "warn", f"{dup} of {s.n} train examples ({dup / n:.1%}) repeat another "
                             f"train example, e.g. {' = '.join(where)}", split, {"count": int(dup)}))
    return out, stats


def run_checks(task, loaded, splits=SPLITS) -> Report:
    """Encode every record of every split through ``task.encode`` and check what the loss sees."""
    c = loaded.campaign
    records = {s: task.records(s) for s in splits}
    records = {s: r for s, r in records.items() if r}
    scan_labels(task, records)  # unknown class names: bad input, all listed at once
    checks, stats, scans = config_checks(c) + label_forms(task, records), {}, {}
    mixup, unknown = MixupScan(c), UnknownScan(task)
    paired = getattr(task, "kind", None) == "preference"
    pair_scans: dict[str, PairScan] = {}
    full_task = None
    with batched(task) as warm:
        for split, recs in records.items():
            s = scans[split] = SplitScan(task, c.data.max_length)
            ps = pair_scans[split] = PairScan(c.data.max_length) if paired else None
            for i, r in enumerate(warmed(recs, warm)):
                if i % NOTE_EVERY == 0:  # a million records encode for minutes (the slow byte tokenizer: 2 s per 5,000)
                    note(f"encoding {split}: {i:,}/{len(recs):,} records through task.encode", done=i, total=len(recs))
                e = task.encode(r)
                if ps is not None:  # each sequence of the pair as the loss sees it, then the pair
                    ps.add(r, e)
                    for k, h in enumerate(halves(e)):
                        s.add(r, h, half=k)
                        unknown.add(split, h)
                    continue
                s.add(r, e)
                mixup.add(split, r, e)
                unknown.add(split, e)
            if s.reencode:
                full_task = full_task or _untruncated(task, loaded)
                s.finish(full_task, split)
    for split, s in scans.items():
        found, stats[split] = split_checks(split, s, c, pair_scans.get(split))
        checks += found
    checks += mixup.checks() + unknown.checks()
    checks += label_checks(task, loaded, scans)
    return Report(checks, stats)


def _untruncated(task, loaded):
    """The same task with no truncation, to measure how long the cut examples really are."""
    big = loaded.with_overrides({"data.max_length": 1 << 30})
    try:
        return type(task)(big, tokenizer=task.tokenizer)
    except TypeError:
        return make_task(big)
