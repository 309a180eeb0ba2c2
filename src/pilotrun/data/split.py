"""A deterministic split by unit (or by period), so no unit crosses the splits.

By unit: units are ordered by a seeded hash of their value, and split where the record counts reach
the ratios, so the same data, field and seed always give the same files, whatever the record order.
By period: whole periods go to the splits in time order (earliest to train); a unit stays whole, in
the split of its first period.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
from pathlib import Path

from pilotrun.console.progress import head
from pilotrun.data.leakage import period_keys
from pilotrun.errors import EXPONENT_FIX, BadInput, beyond_a_float
from pilotrun.journal.files import atomic_write_text
from pilotrun.provenance import file_sha256
from pilotrun.records.readers import SPLIT_LEDGER as LEDGER, SPLIT_WRITTEN_BY as WRITTEN_BY
from pilotrun.records.readers import a_split_ledger, read_records
from pilotrun.records.values import json_value, no_unit, unit_key
from pilotrun.verdicts import StageResult

SPLITS = ("train", "validation", "test")


def parse_ratios(text: str) -> tuple[float, ...]:
    beyond = next(filter(None, map(beyond_a_float, text.split(","))), None)
    if beyond:  # 1e-400 reads as 0: "train above 0" would blame a share the user wrote above 0
        raise BadInput(f"--ratios '{text}': {beyond}", where="--ratios", fix=EXPONENT_FIX)
    try:
        ratios = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise BadInput(f"--ratios '{text}' is not a list of numbers", where="--ratios",
                       fix="give two or three shares that sum to 1, e.g. 0.8,0.1,0.1") from None
    if not all(math.isfinite(r) for r in ratios):  # nan passes every comparison below: --ratios nan put all in train
        raise BadInput(f"--ratios '{text}' holds a share that is not a finite number", where="--ratios",
                       fix="give two or three finite shares that sum to 1, e.g. 0.8,0.1,0.1")
    if not 1 <= len(ratios) <= 3 or any(r < 0 for r in ratios) or ratios[0] <= 0:
        raise BadInput(f"--ratios '{text}': need 1 to 3 shares, none negative, train above 0", where="--ratios",
                       fix="e.g. 0.8,0.1,0.1 (train, validation, test)")
    if abs(sum(ratios) - 1.0) > 1e-6:
        raise BadInput(f"--ratios '{text}' sum to {sum(ratios):g}, not 1", where="--ratios",
                       fix="make the shares sum to 1, e.g. 0.8,0.1,0.1")
    return ratios


def _require(records, name: str, option: str, path) -> None:
    """Every record has the field ``name`` and a value in it: not null, NaN (a missing id in a pandas float column)
    or blank, which a split by unit or period cannot place (as a value, all of them were one unit "null")."""
    missing = [r for r in records if name not in r.fields]
    if missing:
        present = ", ".join(sorted(missing[0].fields)) or "none"
        raise BadInput(f"{len(missing)} of {len(records)} records in {path} have no field '{name}' (named by "
                       f"{option}); fields present: {present}", where=missing[0].where,
                       fix=f"give every record a '{name}', or name another field with {option}")
    empty = [r.where for r in records if no_unit(r.fields[name])]
    if empty:
        raise BadInput(f"{len(empty)} of {len(records)} records in {path} have no value for '{name}' (named by "
                       f"{option}: null, NaN or blank), e.g. {', '.join(empty[:3])}: the split cannot place them",
                       where=empty[0], fix=f"give every record its '{name}', or remove those records"
                       + (" (or split without --by: each record its own unit)" if option == "--by" else ""))


def _rank(seed: int, value: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{value}".encode("utf-8"), digest_size=16).digest()


def _assign(sizes: list[int], ratios) -> list[int]:
    """Split index of each block (in order) so the record counts follow the ratios."""
    total = sum(sizes) or 1
    bounds = [sum(ratios[: k + 1]) for k in range(len(ratios) - 1)]
    out, done = [], 0
    for n in sizes:
        out.append(bisect.bisect_right(bounds, (done + n / 2) / total))
        done += n
    return out


def unit_of(record, by: str | None) -> str:
    """The unit a record belongs to: the value of its field ``by`` (a list or an object is one value: two records
    share a unit when their values are equal, as JSON), else the record itself (its fields, so exact copies
    stay together in one split)."""
    return unit_key(record.fields[by] if by else record.fields)


def split_records(records, by: str | None, ratios, seed: int = 0, keys: list | None = None):
    """{split: [records]} and the number of units whose records span more than one period block (``keys``: each
    record's period, comparable: ``period_keys``; None splits by unit alone)."""
    units: dict[str, list] = {}
    for r in records:
        units.setdefault(unit_of(r, by), []).append(r)
    spanning = 0
    if keys is None:
        order = sorted(units, key=lambda u: _rank(seed, u))
        where = dict(zip(order, _assign([len(units[u]) for u in order], ratios)))
    else:
        key_of = {id(r): k for r, k in zip(records, keys)}
        first = {u: min(key_of[id(r)] for r in rs) for u, rs in units.items()}
        periods = sorted(set(first.values()))
        size = dict.fromkeys(periods, 0)
        for u, rs in units.items():
            size[first[u]] += len(rs)
        block = dict(zip(periods, _assign([size[p] for p in periods], ratios)))
        where = {u: block[first[u]] for u in units}
        lows = {}
        for p in periods:
            lows.setdefault(block[p], p)
        starts = sorted(lows.values())
        for u, rs in units.items():
            if any(bisect.bisect_right(starts, key_of[id(r)]) != bisect.bisect_right(starts, first[u]) for r in rs):
                spanning += 1
    out = {s: [] for s in SPLITS[: len(ratios)]}
    for r in records:  # keep the file's record order inside each split
        out[SPLITS[where[unit_of(r, by)]]].append(r)
    return out, spanning


def _ledger(out: Path) -> dict[str, set[str]]:
    """File name → the sha256s an earlier split wrote under it in ``out`` (its ``split.json``; ``pending``: the files
    of a split cut short between its ledger and its last file). A split.json that split did not write is exit 2."""
    path = out / LEDGER
    if not os.path.lexists(path):
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    if not a_split_ledger(doc):
        raise BadInput(f"holds a {LEDGER} that split did not write; split records in it what it writes there",
                       where=str(path), fix=f"give --out another folder, or move {path} away first")
    known: dict[str, set[str]] = {}
    for part in ("files", "pending"):
        for name, digest in (doc.get(part) or {}).items() if isinstance(doc.get(part), dict) else ():
            if isinstance(digest, str):  # a value edited into another type lists nothing
                known.setdefault(name, set()).add(digest)
    return known


def _replaceable(out: Path, data: Path) -> dict[str, str]:
    """Of train/validation/test.jsonl in ``out``, those an earlier split wrote there and nobody changed since (name →
    sha256): this split replaces them, or removes them where it writes no such part now (a test.jsonl of an earlier
    0.8,0.1,0.1 split beside a new 0.9,0.1 one holds records now in train). DATA itself, or a file of records split did
    not write (the user's own train.jsonl in `--out data/`), is exit 2 before anything is read: it would be lost."""
    known, ours = _ledger(out), {}
    for s in SPLITS:
        path = out / f"{s}.jsonl"
        try:
            if not path.is_file() or path.stat().st_size == 0:
                continue  # nothing there to lose (a folder of that name is refused where it is written)
            if os.path.samefile(path, data):
                raise BadInput(f"--out {out} would replace {path}, the DATA being split", where=str(path),
                               fix=f"give --out another folder, e.g. --out {out / 'split'}")
            digest = file_sha256(path)
        except OSError:
            continue  # unreadable: the write says why
        if digest not in known.get(path.name, ()):
            raise BadInput(f"split did not write this file (or it changed since: no {LEDGER} beside it lists it); the "
                           "split would replace it", where=str(path),
                           fix=f"give --out a new folder, or move {path} away first")
        ours[path.name] = digest
    return ours


def _write_split(out: Path, texts: dict[str, str], ours: dict[str, str], how: dict) -> list[str]:
    """The split's files, its ledger before them (naming them pending) and after; an earlier split's file that this
    one does not write is removed. Returns what was said of the removed ones."""
    new = {f"{s}.jsonl": hashlib.sha256(t.encode("utf-8")).hexdigest() for s, t in texts.items()}
    ledger = {"written_by": WRITTEN_BY, **how}
    atomic_write_text(out / LEDGER, json.dumps({**ledger, "files": ours, "pending": new}, indent=2) + "\n")
    for split, text in texts.items():
        atomic_write_text(out / f"{split}.jsonl", text)
    said = []
    for name in sorted(set(ours) - set(new)):
        (out / name).unlink(missing_ok=True)
        said.append(f"removed {out / name}: an earlier split's, and this split has no {name[:-6]} part")
    atomic_write_text(out / LEDGER, json.dumps({**ledger, "files": new}, indent=2) + "\n")
    return said


def split_file(data: str | Path, by: str | None, ratios, out: str | Path, seed: int = 0,
               period: str | None = None) -> StageResult:
    """``by`` None: each record is its own unit (records with no unit field; exact copies stay together). What an
    earlier split wrote in ``out`` is replaced; nothing else there is (``_replaceable``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput("is a file, not a folder", where=str(out), fix="give --out a folder")
    ours = _replaceable(out, Path(data))
    head(f"reading {data}")
    records = read_records(data)
    head(f"placing {len(records):,} records by {f'{by!r}' if by else 'record'}" + (f" and period {period!r}" if period
                                                                                     else ""))
    if by:
        _require(records, by, "--by", data)
    keys = None
    if period:
        _require(records, period, "--period", data)
        keys, unordered = period_keys([r.fields[period] for r in records])
        if unordered:
            raise BadInput(f"--period {period}: {unordered}; a split by period would not follow time",
                           where=str(data), fix=f"write every '{period}' as an ISO date (2023-02-15) or a number, then "
                                                "split again")
    parts, spanning = split_records(records, by, ratios, seed, keys)
    rows, messages, written = [], [], {}
    head(f"writing {', '.join(f'{s} ({len(rs):,})' for s, rs in parts.items())} into {out}")
    try:  # a Parquet file's dates, times and decimals as JSON text (json_value)
        texts = {s: "".join(json.dumps(r.fields, ensure_ascii=False, default=json_value) + "\n" for r in rs)
                 for s, rs in parts.items() if rs}
    except BadInput as e:
        raise BadInput(e.detail, where=str(data), fix=e.fix) from None
    how = {"data": str(Path(data).resolve()), "by": by, "period": period, "ratios": list(ratios), "seed": seed}
    messages += _write_split(out, texts, ours, how)
    written = {split: str(out / f"{split}.jsonl") for split in texts}
    for split, rs in parts.items():
        n_units = len({unit_of(r, by) for r in rs})
        rows.append({"split": split, "records": len(rs), "units": n_units, "share": round(len(rs) / len(records), 4),
                     "file": written.get(split, "(empty: not written)")})
    empty = [s for s, rs in parts.items() if not rs]
    verdict = "ok"
    if empty:
        verdict = "warn"
        messages.append(f"{', '.join(empty)} got no unit: too few " + (f"units of '{by}'" if by else "records")
                        + (" or periods" if period else "") + " for these ratios")
    if spanning:
        verdict = "warn"
        messages.append(f"{spanning} units of '{by}' have records in periods of a later split; they stay whole in "
                        "the split of their first period, so `pilotrun leakage` will report the period overlap")
    messages.append("campaign keys: " + ", ".join(f"data.{s}: {p}" for s, p in written.items())
                    + (f", data.group_by: {by}" if by else "") + (f", data.period_by: {period}" if period else ""))
    summary = f"{len(records)} records of {data} split by {by or 'record'}" + \
        (f" and period {period}" if period else "") + \
        f" into {out}: " + ", ".join(f"{r['split']} {r['records']}" for r in rows)
    return StageResult("split", verdict, summary, messages,
                       {"files": written, "seed": seed, "ratios": list(ratios), "spanning_units": spanning},
                       ["split", "records", "units", "share", "file"], rows)
