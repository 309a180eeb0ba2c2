"""Leakage across splits, on the raw record text: shared units, exact and near duplicates, period order.

The unit of comparison is the leakage unit: with ``data.group_by`` all records of one unit (a
conversation, a patient) form one text, since the unit is what must not cross splits; without it,
each record is its own unit. A split is read, reduced to arrays (a hash and a MinHash signature per
unit) and dropped before the next, so memory holds no per-token objects and time grows linearly.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import re
import unicodedata
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime

import numpy as np

from pilotrun.console.progress import head, note
from pilotrun.data import minhash
from pilotrun.errors import BadInput
from pilotrun.records.stream import iter_chunks
from pilotrun.records.values import no_unit, unit_key
from pilotrun.tasks import common
from pilotrun.verdicts import Check

FEW = 3
CHUNK = 4096
ASSISTANT = ("assistant", "gpt", "bot", "model")  # roles whose turns are targets (tasks/chat.py's aliases)
SAME_RESPONSE = 0.5  # responses this alike (estimated Jaccard) to the other split's make the record a near duplicate
PROMPT_FAIL_SHARE = 0.01  # README (leakage): 1% of a split's prompts already trained on biases its loss as
# much as the differences between arms a sweep ranks; below it a warning names them (short generic prompts
# such as "hi" or "Summarise." do repeat in honest data)


@functools.cache
def _punctuation() -> tuple[dict, dict]:
    """Translation tables sending every Unicode punctuation character (categories P*) to a space: one for
    ASCII text (the common case, translated fastest), one for the rest. Built once, on first use, from the
    first two planes: the planes above hold ideographs and tags, no punctuation (and scanning all 1.1M code
    points costs seconds)."""
    every = {i: " " for i in range(0x20000) if unicodedata.category(chr(i)).startswith("P")}
    return {i: " " for i in every if i < 128}, every


def normalise(text: str) -> str:
    """The text leakage compares: Unicode NFKC (full-width and compatibility forms to their plain letters),
    case folded, every punctuation character (Unicode category P*: quotes, dashes, commas, ellipses …) turned
    into a space, and any run of whitespace into one space. A copy whose punctuation was retyped, removed or
    made typographic (" → “ ”, ' → ’, -- → —) is then the same text; symbols (+, =, $) and digits stay, since
    they change meaning. Shingles are word 3-grams of this text."""
    ascii_table, table = _punctuation()
    if text.isascii():
        return " ".join(text.translate(ascii_table).casefold().split())
    return " ".join(unicodedata.normalize("NFKC", text).casefold().translate(table).split())


def exact_key(normalised: str) -> str:
    """What the exact hash covers: the normalised text without its spaces, so punctuation removed next to a
    space (``"a,b"`` for ``"a, b"``) or inside a word (``"its"`` for ``"it's"``) is still the same record."""
    return normalised.replace(" ", "")


def text_of(c):
    """A function giving the text a record trains on: prompt fields and response, chat contents, or the
    seq-cls text; the fields are worked out once, not per record."""
    d = c.data
    if c.task == "preference":
        prompt, answers = prompt_of(c), response_of(c)
        return lambda record: "\n".join(t for t in ((prompt(record) if prompt else ""), answers(record)) if t)
    if c.task == "causal-lm" and d.messages:
        def chat(record) -> str:
            msgs = common.field(record, d.messages, "data.messages")
            if not isinstance(msgs, list):
                return str(msgs)
            return "\n".join(str(m.get("content", m.get("value", ""))) for m in msgs if isinstance(m, dict))
        return chat
    if c.task == "causal-lm":
        names = [(n, "data.prompt") for n in ((common.template_fields(d.prompt) or [d.prompt]) if d.prompt else [])]
        names.append((d.response, "data.response"))
    elif c.task == "seq-cls":
        names = [(d.text, "data.text")]
    else:
        skip = {d.group_by, d.period_by}
        return lambda r: "\n".join(str(v) for k, v in sorted(r.fields.items()) if k not in skip and isinstance(v, str))

    def fields(record) -> str:
        return "\n".join(common.text_field(record, n, key, allow_empty=True) for n, key in names)
    return fields


def prompt_of(c):
    """A function giving the non-target text of a causal-lm record — the prompt fields, or a conversation's
    system and user turns —, or None where the task has no separate prompt (seq-cls: the text is the input
    and exact duplicates already compare it)."""
    d = c.data
    if c.task not in ("causal-lm", "preference"):
        return None
    if c.task == "preference" and not d.messages and not d.prompt:  # two whole conversations: their shared start
        def shared(record) -> str:
            a, b = (_turns(common.field(record, f, k)) for f, k in ((d.chosen, "data.chosen"),
                                                                    (d.rejected, "data.rejected")))
            k = 0
            while k < min(len(a), len(b)) - 1 and a[k] == b[k]:
                k += 1
            return "\n".join(_content(m) for m in a[:k])
        return shared
    if d.messages:
        def chat(record) -> str:
            msgs = common.field(record, d.messages, "data.messages")
            if not isinstance(msgs, list):
                return ""
            return "\n".join(str(m.get("content", m.get("value", ""))) for m in msgs if isinstance(m, dict)
                             and str(m.get("role", m.get("from"))) not in ASSISTANT)
        return chat
    if not d.prompt:
        return None
    names = common.template_fields(d.prompt) or [d.prompt]
    return lambda record: "\n".join(common.text_field(record, n, "data.prompt", allow_empty=True) for n in names)


def _turns(value) -> list:
    return value if isinstance(value, list) else [value]


def _content(m) -> str:
    return str(m.get("content", m.get("value", ""))) if isinstance(m, dict) else str(m)


def response_of(c):
    """The target text of a causal-lm record: the response field, or a conversation's assistant turns; of a
    preference pair: both answers (chosen, then rejected)."""
    d = c.data
    if c.task == "preference":
        def answers(record) -> str:
            return "\n".join(_content(m) for f, k in ((d.chosen, "data.chosen"), (d.rejected, "data.rejected"))
                             for m in _turns(common.field(record, f, k)) if not isinstance(m, dict)
                             or str(m.get("role", m.get("from"))) in ASSISTANT)
        return answers
    if d.messages:
        def chat(record) -> str:
            msgs = common.field(record, d.messages, "data.messages")
            return "\n".join(str(m.get("content", m.get("value", ""))) for m in msgs if isinstance(m, dict)
                             and str(m.get("role", m.get("from"))) in ASSISTANT) if isinstance(msgs, list) else ""
        return chat
    return lambda record: common.text_field(record, d.response, "data.response", allow_empty=True)


def _texts_at(c, split: str, wanted: set[int], text) -> dict[int, str]:
    """The normalised text of the records at these positions of a split (a second read, only for them)."""
    out, k = {}, 0
    for records in iter_chunks(getattr(c.data, split)):
        for r in records:
            if k in wanted:
                out[k] = normalise(text(r))
            k += 1
    return out


def record_text(c, record) -> str:
    return text_of(c)(record)


def _require(records, name: str, key: str, path) -> None:
    missing = next((r for r in records if name not in r.fields), None)
    if missing is not None:
        present = ", ".join(sorted(missing.fields)) or "none"
        raise BadInput(f"a record of {path} has no field '{name}' (named by {key}); fields present: {present}",
                       where=missing.where, fix=f"add '{name}' to every record, or set {key} to a field every record has")


@dataclass
class SplitUnits:
    """One split reduced to arrays, one row per unit."""

    split: str
    records: int
    where: list[str]  # the first record of each unit
    names: list[str] | None  # unit values (group_by), or None when records are units
    digest: np.ndarray  # uint64 hash of the normalised unit text
    sig: np.ndarray  # (PERMS, units) MinHash signatures, one column per unit
    periods: list | None  # the period_by values of the records that have one
    prompt_digest: np.ndarray | None = None  # uint64 per record: the normalised prompt (0: none)
    record_digest: np.ndarray | None = None  # uint64 per record: the normalised record text
    record_where: list[str] | None = None
    no_unit: list[str] | None = None  # the records whose group_by value is null, NaN or blank: each its own unit
    no_period: list[str] | None = None  # the records whose period_by value is null, NaN or blank: not in periods
    _index: list | None = None

    def index(self) -> list:
        if self._index is None:
            self._index = minhash.band_index(self.sig)
        return self._index


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def reduce_split(c, split: str, chunks) -> SplitUnits:
    """One split, chunk by chunk of records, to a hash and a signature per unit."""
    d = c.data
    path = getattr(d, split)
    digests, sigs, where, periods, code, missing, no_period = [], [], [], [] if d.period_by else None, [], [], []
    codes: dict[str, int] = {}
    text, prompt = text_of(c), prompt_of(c)
    prompts: list[np.ndarray] = []
    for records in chunks:
        if d.group_by:
            _require(records, d.group_by, "data.group_by", path)
            keys = []
            for r in records:
                value = r.fields[d.group_by]
                if no_unit(value):  # each its own unit, never shared, named by missing_units
                    missing.append(r.where)
                    keys.append(NO_UNIT + r.where)
                else:
                    keys.append(unit_key(value))
            code.append(np.fromiter((codes.setdefault(k, len(codes)) for k in keys), dtype=np.int64, count=len(keys)))
        if d.period_by:
            _require(records, d.period_by, "data.period_by", path)
            for r in records:  # a record with no period is out of the order (period_order names it)
                value = r.fields[d.period_by]
                if no_unit(value):
                    no_period.append(r.where)
                else:
                    periods.append(value)
        texts = [normalise(text(r)) for r in records]
        digests.append(np.fromiter((_digest(exact_key(t)) if t else 0 for t in texts), dtype=np.uint64,
                                   count=len(texts)))
        sigs += [minhash.signatures(texts[i:i + CHUNK]) for i in range(0, len(texts), CHUNK)]
        where += [r.where for r in records]
        if prompt is not None:
            keys = (exact_key(normalise(prompt(r))) for r in records)
            prompts.append(np.fromiter((_digest(k) if k else 0 for k in keys), dtype=np.uint64, count=len(records)))
        note(f"{len(where):,} records hashed and signed")
    digest = np.concatenate(digests) if digests else np.empty(0, np.uint64)
    per_record = {"prompt_digest": np.concatenate(prompts) if prompts else None, "record_digest": digest,
                  "record_where": where} if prompt is not None else {}
    if not d.group_by:
        sig = np.concatenate(sigs, axis=1) if sigs else np.empty((minhash.PERMS, 0), np.uint32)
        return SplitUnits(split, len(where), where, None, digest, sig, periods, **per_record, no_period=no_period)
    code = np.concatenate(code) if code else np.empty(0, np.int64)
    # units usually come in runs (a conversation's records together): then the order is the file's own
    order = np.arange(code.size) if np.all(code[1:] >= code[:-1]) else np.argsort(code, kind="stable")
    starts = np.flatnonzero(np.concatenate(([True], code[order][1:] != code[order][:-1])))
    pos = np.arange(order.size) - np.repeat(starts, np.diff(np.append(starts, order.size)))
    with np.errstate(over="ignore"):
        weights = minhash._powers(minhash._P, int(pos.max()) + 1)[pos] if pos.size else pos.astype(np.uint64)
        unit_digest = np.add.reduceat(digest[order] * weights, starts, dtype=np.uint64)
    # one slot row at a time, never the whole (PERMS, records) signature matrix: the unit signatures are
    # the slot-wise minima over each unit's records
    unit_sig = np.empty((minhash.PERMS, starts.size), np.uint32)
    for k in range(minhash.PERMS):
        unit_sig[k] = np.minimum.reduceat(np.concatenate([c[k] for c in sigs])[order], starts)
    return SplitUnits(split, len(where), [where[order[s]] for s in starts], list(codes), unit_digest, unit_sig,
                      periods, **per_record, no_unit=missing, no_period=no_period)


def _share(n: int, of: int) -> str:
    return f"{n} of {of} ({n / max(of, 1):.1%})"


def _unit(u: SplitUnits, i: int) -> str:
    if u.names is None or u.names[i].startswith(NO_UNIT):
        return u.where[i]
    return f"{u.where[i]} ({u.names[i]})"


NO_UNIT = "\x00no value: "  # the key of a record with no unit value, followed by where it is: never shared


def missing_units(u: SplitUnits, field: str) -> Check | None:
    if not u.no_unit:
        return None
    return Check("no-unit", "warn", f"{_share(len(u.no_unit), u.records)} {u.split} records have no value for "
                 f"'{field}' (data.group_by: null, NaN or blank), e.g. {', '.join(u.no_unit[:FEW])}: no split can be "
                 "kept free of their unit, so each is compared alone, by its text only; give every record its unit, "
                 "or remove them", u.split, {"count": len(u.no_unit), "records": u.no_unit[:FEW]})


def group_overlap(a: SplitUnits, b: SplitUnits, field: str) -> Check | None:
    shared = sorted(set(a.names) & set(b.names))
    if not shared:
        return None
    units = len(b.names) - len(b.no_unit or ())
    return Check("shared-units", "fail", f"{_share(len(shared), units)} {b.split} units of '{field}' "
                 f"(data.group_by) also occur in {a.split}, e.g. {', '.join(map(repr, shared[:FEW]))}; split by "
                 f"unit with `pilotrun split DATA --by {field}`", b.split, {"count": len(shared), "values": shared[:FEW]})


def exact_duplicates(a: SplitUnits, b: SplitUnits) -> Check | None:
    live = b.digest != 0
    hit = np.flatnonzero(live & np.isin(b.digest, a.digest[a.digest != 0]))
    if not hit.size:
        return None
    first_a = {}
    for i in np.flatnonzero(np.isin(a.digest, b.digest[hit])):
        first_a.setdefault(int(a.digest[i]), int(i))
    pairs = [f"{_unit(b, j)} = {_unit(a, first_a[int(b.digest[j])])}" for j in hit[:FEW]]
    return Check("exact-duplicates", "fail", f"{_share(hit.size, b.digest.size)} {b.split} units repeat a {a.split} "
                 f"unit exactly after normalising Unicode (NFKC), case, punctuation and whitespace, e.g. "
                 f"{'; '.join(pairs)}", b.split,
                 {"count": int(hit.size), "pairs": pairs})


def shared_prompts(c, a: SplitUnits, b: SplitUnits) -> Check | None:
    """Records of b whose prompt (normalised as for exact duplicates) is also a prompt in a, with another
    response: the model was taught an answer to that question. Each record is reported once, by its
    closest relation: whole-record duplicates and near-same responses (estimated Jaccard ≥ SAME_RESPONSE
    to a response of that prompt in a) are the duplicate checks' to report."""
    if a.prompt_digest is None or b.prompt_digest is None:
        return None
    hit = (b.prompt_digest != 0) & np.isin(b.prompt_digest, a.prompt_digest[a.prompt_digest != 0])
    whole = hit & np.isin(b.record_digest, a.record_digest)
    candidates = np.flatnonzero(hit & ~whole)
    if not candidates.size:
        return None
    by_prompt: dict[int, list[int]] = {}
    for i in np.flatnonzero(np.isin(a.prompt_digest, b.prompt_digest[candidates])):
        if len(by_prompt.setdefault(int(a.prompt_digest[i]), [])) < 8:  # a few of a prompt's answers suffice
            by_prompt[int(a.prompt_digest[i])].append(int(i))
    response = response_of(c)
    text_b = _texts_at(c, b.split, {int(j) for j in candidates}, response)
    text_a = _texts_at(c, a.split, {i for ids in by_prompt.values() for i in ids}, response)
    keys_a, keys_b = list(text_a), [int(j) for j in candidates]
    sig_a = dict(zip(keys_a, minhash.signatures([text_a[i] for i in keys_a]).T))
    sig_b = dict(zip(keys_b, minhash.signatures([text_b[j] for j in keys_b]).T))
    other = [j for j in keys_b if max(float(np.mean(sig_b[j] == sig_a[i])) for i in by_prompt[int(b.prompt_digest[j])])
             < SAME_RESPONSE]
    if not other:
        return None
    pairs = [f"{b.record_where[j]} asks {a.record_where[by_prompt[int(b.prompt_digest[j])][0]]}'s prompt"
             for j in other[:FEW]]
    n = int(b.prompt_digest.size)
    verdict = "fail" if len(other) >= PROMPT_FAIL_SHARE * n else "warn"
    extra = f" ({int(whole.sum())} more repeat the whole record: exact-duplicates)" if whole.any() else ""
    return Check("shared-prompts", verdict, f"{_share(len(other), n)} {b.split} prompts also occur in {a.split} with "
                 f"another response{extra}, normalised as for exact duplicates, e.g. {'; '.join(pairs)}: the model is "
                 f"taught an answer to each of these questions; keep each prompt in one split (`pilotrun split DATA "
                 f"--by FIELD` with the prompt's field)", b.split,
                 {"count": len(other), "whole_record": int(whole.sum()), "pairs": pairs})


def near_duplicates(a: SplitUnits, b: SplitUnits, threshold: float) -> Check | None:
    ia, ib, sim = minhash.near_pairs(a.sig, b.sig, threshold, a.index())
    keep = a.digest[ia] != b.digest[ib]  # exact duplicates are reported on their own
    ia, ib, sim = ia[keep], ib[keep], sim[keep]
    if not ia.size:
        return None
    n_units = np.unique(ib).size
    top = np.argsort(-sim, kind="stable")[:FEW]
    pairs = [f"{_unit(b, ib[k])} ~ {_unit(a, ia[k])} (J≈{sim[k]:.2f})" for k in top]
    return Check("near-duplicates", "warn", f"{_share(n_units, b.digest.size)} {b.split} units are near duplicates "
                 f"of {a.split} units (estimated Jaccard ≥ {threshold} over {minhash.SHINGLE}-word shingles), e.g. "
                 f"{'; '.join(pairs)}", b.split,
                 {"count": int(n_units), "pairs": [[_unit(b, ib[k]), _unit(a, ia[k]), float(sim[k])] for k in top]})



# a date written another way than ISO: day and month first (12/01/2022, 1.12.2022, 01-12-2022), a slashed ISO order
# (2022/12/01), a month's name (Dec 1, 2022; 1 December 2022). As text they sort by month or by name, not by time
_OTHER_DATE = re.compile(r"\d{1,2}[/.\-]\d{1,2}[/.\-]\d{2,4}|\d{4}[/.]\d{1,2}[/.]\d{1,2}"
                         r"|[A-Za-z]{3,9}\.? \d{1,2},? \d{4}|\d{1,2} [A-Za-z]{3,9}\.? \d{4}")


def period_keys(values: list) -> tuple[list | None, str | None]:
    """(``values``, periods as read, as comparable keys: numbers, ISO dates and times, else their text; None), or
    (None, why they have no time order). Periods of several kinds (2023-01-05 beside 02/15/2023) were all compared
    as text, and dates written day- or month-first sort as text by their first number (12/01/2022 after
    01/15/2023): a split "by period" put 2022's autumn in validation and 2023 in train, and said ok."""
    keys, first = [], {}
    for v in values:
        for kind, conv in (("a number", float), ("an ISO date", _iso), ("text", str)):
            try:
                keys.append(conv(v))
            except (TypeError, ValueError):
                continue
            first.setdefault(kind, v)
            break
        if len(first) > 1:
            shown = "; ".join(f"{k}: {x!r}" for k, x in first.items())
            return None, (f"its values are not of one kind ({shown}), so they would be compared as text, whose "
                          "order is not time's")
    other = "text" in first and next((v for v in values if isinstance(v, str) and _OTHER_DATE.fullmatch(v.strip())),
                                     None)
    if other:
        return None, (f"its values are dates not written as ISO dates ({other!r}): compared as text they sort by "
                      "their first part (12/01/2022 after 01/15/2023), not by time")
    return keys, None


def _iso(v):
    if isinstance(v, (date, datetime)):
        return datetime(v.year, v.month, v.day) if not isinstance(v, datetime) else v.replace(tzinfo=None)
    s = str(v)
    if re.fullmatch(r"\d{4}-\d{2}", s):
        s += "-01"
    return datetime.fromisoformat(s).replace(tzinfo=None)


def period_order(units: dict[str, SplitUnits], key: str) -> list[Check]:
    train = units.get("train")
    if train is None or train.periods is None:
        return []
    names = list(units)
    out = []
    # a record with no period (null, NaN, blank) is out of the order (reduce_split keeps none for it), and named: a
    # NaN compared as nothing (min and max of the split went wrong) and a null turned every period to text ("10" < "9")
    periods = {s: units[s].periods for s in names}
    for s in names:
        if units[s].no_period:
            none = units[s].no_period
            out.append(Check("no-period", "warn", f"{_share(len(none), len(none) + len(periods[s]))} {s} records "
                             f"have no value for '{key}' (data.period_by: null, NaN or blank), e.g. "
                             f"{', '.join(none[:FEW])}: the period order leaves them out; give every record its "
                             "period", s, {"count": len(none), "records": none[:FEW]}))
    if not periods["train"]:
        return out
    keys, unordered = period_keys([v for s in names for v in periods[s]])  # one kind across the splits
    if unordered:
        return out + [Check("period-format", "fail", f"data.period_by '{key}': {unordered}; the period order cannot "
                            f"be checked: write every '{key}' as an ISO date (2023-02-15) or a number", "train",
                            {"reason": unordered})]
    keyed, at = {}, 0
    for s in names:
        keyed[s], at = keys[at:at + len(periods[s])], at + len(periods[s])
    raw = {s: dict(zip(keyed[s], periods[s])) for s in names}
    lo_t, hi_t = min(keyed["train"]), max(keyed["train"])
    for s in names:
        if s == "train" or not keyed[s]:
            continue
        lo, hi = min(keyed[s]), max(keyed[s])
        if lo > hi_t:
            continue
        early = sum(1 for v in keyed[s] if v <= hi_t)
        how = "precede" if hi < lo_t else "overlap"
        out.append(Check("period-order", "fail", f"{s} periods {raw[s][lo]}..{raw[s][hi]} {how} train periods "
                         f"{raw['train'][lo_t]}..{raw['train'][hi_t]} ({_share(early, len(keyed[s]))} {s} records "
                         f"at or before the last train period); {s} must come after train: `pilotrun split DATA "
                         f"--by FIELD --period {key}`", s, {"records": early, "relation": how}))
    return out


@contextmanager
def _no_cycle_collection():
    """Records are plain dicts and make no reference cycles; CPython's cycle collector would rescan the
    millions of them on every full pass while they are read, making time grow faster than the records."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def leakage_checks(loaded, threshold: float = 0.8) -> tuple[list[Check], dict]:
    """Every check across the splits of a campaign; returns the checks and per-split counts."""
    c = loaded.campaign
    units: dict[str, SplitUnits] = {}

    for split in common.SPLITS:
        if getattr(c.data, split):
            head(f"reading {split}")  # a file of millions of records is minutes of hashing and MinHash
            with _no_cycle_collection():
                units[split] = reduce_split(c, split, iter_chunks(getattr(c.data, split)))
    head(f"comparing {' / '.join(units)}")  # units, exact and near duplicates, shared prompts, periods
    checks: list[Check] = []
    if c.data.group_by:
        checks += [found for u in units.values() if (found := missing_units(u, c.data.group_by))]
    names = list(units)
    for i, sa in enumerate(names):
        for sb in names[i + 1:]:
            a, b = units[sa], units[sb]
            if c.data.group_by:
                found = group_overlap(a, b, c.data.group_by)
                if found:
                    checks.append(found)
            for found in (exact_duplicates(a, b), shared_prompts(c, a, b), near_duplicates(a, b, threshold)):
                if found:
                    checks.append(found)
    if c.data.period_by:
        checks += period_order(units, c.data.period_by)
    counts = {s: {"records": u.records, "units": int(u.digest.size)} for s, u in units.items()}
    return checks, counts
