"""pilotrun split: deterministic, by unit or period; its output passes the leakage checks; bad input exits 2."""

import json
import random

import pytest
from conftest import write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.demo.synth import conversations
from pilotrun.rehearsal.data_checks.leakage import leakage


def _records():
    return [r for conv in conversations(60, seed=3) for r in conv]


def _read(folder):
    return {s: [json.loads(x) for x in (folder / f"{s}.jsonl").read_text().splitlines()]
            for s in ("train", "validation", "test") if (folder / f"{s}.jsonl").exists()}


def _campaign(folder, out, **data):
    c = {"name": "s", "task": "causal-lm", "model": {"config": {"model_type": "llama"}, "tokenizer": "byte"},
         "data": {"train": str(out / "train.jsonl"), "validation": str(out / "validation.jsonl"),
                  "test": str(out / "test.jsonl"), "prompt": "instruction", "response": "output", **data}}
    return write_campaign(folder, c)


def test_split_by_unit_is_deterministic_and_leak_free(tmp_path, cli):
    recs = _records()
    data = write_jsonl(tmp_path / "all.jsonl", recs)
    res = cli("split", data, "--by", "conversation_id", "--ratios", "0.8,0.1,0.1", "--out", tmp_path / "a", "--json")
    assert res.code == 0, res.err
    parts = _read(tmp_path / "a")
    units = {s: {r["conversation_id"] for r in rs} for s, rs in parts.items()}
    assert not (units["train"] & units["validation"]) and not (units["train"] & units["test"])
    assert not (units["validation"] & units["test"])
    assert sum(len(rs) for rs in parts.values()) == len(recs)
    assert 0.7 < len(parts["train"]) / len(recs) < 0.9
    assert res.json["data"]["files"]["train"].endswith("train.jsonl")
    # same data, field and seed: the same files, whatever the record order
    shuffled = recs[:]
    random.Random(1).shuffle(shuffled)
    cli("split", write_jsonl(tmp_path / "shuffled.jsonl", shuffled), "--by", "conversation_id", "--out",
        tmp_path / "b")
    again = _read(tmp_path / "b")
    assert {s: sorted(json.dumps(r) for r in rs) for s, rs in again.items()} == \
        {s: sorted(json.dumps(r) for r in rs) for s, rs in parts.items()}
    other = cli("split", data, "--by", "conversation_id", "--out", tmp_path / "c", "--seed", "7")
    assert other.code == 0 and _read(tmp_path / "c") != parts
    result = leakage(load_campaign(_campaign(tmp_path, tmp_path / "a", group_by="conversation_id")))
    assert not [c for c in result.data["checks"] if c["name"] == "shared-units"]


def test_split_by_period_sends_earliest_to_train(tmp_path, cli):
    # one month per conversation, so no unit spans periods
    recs = [dict(r, month=f"2023-{1 + int(r['conversation_id'][-2:]) % 10:02d}") for r in _records()]
    data = write_jsonl(tmp_path / "all.jsonl", recs)
    res = cli("split", data, "--by", "conversation_id", "--period", "month", "--out", tmp_path / "p")
    assert res.code == 0, res.out + res.err
    said = [ln.split(" (")[0] for ln in res.err.splitlines() if ln.startswith("pilotrun split: ")]
    assert said[:3] == ["pilotrun split: started", f"pilotrun split: reading {data}",
                        f"pilotrun split: placing {len(recs)} records by 'conversation_id' and period 'month'"], res.err
    assert said[3:] == ["pilotrun split: writing train", "pilotrun split: ended"], said
    parts = _read(tmp_path / "p")
    months = {s: sorted({r["month"] for r in rs}) for s, rs in parts.items()}
    assert months["train"][-1] < months["validation"][0] <= months["validation"][-1] < months["test"][0]
    path = _campaign(tmp_path, tmp_path / "p", group_by="conversation_id", period_by="month")
    assert leakage(load_campaign(path)).verdict == "ok"


@pytest.mark.parametrize("fmt, said", [
    ("%m/%d/%Y", "its values are dates not written as ISO dates ('06/01/2022'): compared as text they sort by their "
                 "first part (12/01/2022 after 01/15/2023), not by time"),
    ("%d.%m.%Y", "its values are dates not written as ISO dates ('01.06.2022')"),
    ("%b %d, %Y", "its values are dates not written as ISO dates ('Jun 01, 2022')"),
])
def test_a_split_by_dates_that_sort_as_text_is_refused(tmp_path, cli, fmt, said):
    # ordered as text, a split "by period" of month-first dates put 2022's autumn in validation and 2023 in train
    import datetime

    days = [datetime.date(2022, 6, 1) + datetime.timedelta(days=4 * i) for i in range(120)]
    recs = [{"id": i, "instruction": f"q{i}", "output": "a", "day": d.strftime(fmt)} for i, d in enumerate(days)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    res = cli("split", data, "--by", "id", "--period", "day", "--ratios", "0.8,0.2", "--out", tmp_path / "o")
    assert res.code == 2, res.err
    assert f"--period day: {said}" in res.err and "; a split by period would not follow time" in res.err, res.err
    assert "fix: write every 'day' as an ISO date (2023-02-15) or a number, then split again" in res.err
    assert not (tmp_path / "o").exists()
    # the clean case: the same days as ISO dates split in time order
    write_jsonl(tmp_path / "d.jsonl", [dict(r, day=d.isoformat()) for r, d in zip(recs, days)])
    res = cli("split", data, "--by", "id", "--period", "day", "--ratios", "0.8,0.2", "--out", tmp_path / "o")
    assert res.code == 0, res.err
    parts = _read(tmp_path / "o")
    assert max(r["day"] for r in parts["train"]) < min(r["day"] for r in parts["validation"])


def test_split_reports_units_spanning_periods(tmp_path, cli):
    recs = [{"cid": f"c{i}", "t": f"2023-{1 + i % 10:02d}", "instruction": f"q{i}", "output": "a"} for i in range(40)]
    recs.append({"cid": "c0", "t": "2023-12", "instruction": "late turn", "output": "b"})
    res = cli("split", write_jsonl(tmp_path / "d.jsonl", recs), "--by", "cid", "--period", "t", "--out",
              tmp_path / "o", "--json")
    assert res.code == 0
    assert res.json["verdict"] == "warn" and res.json["data"]["spanning_units"] == 1
    assert "1 units of 'cid' have records in periods of a later split" in res.json["messages"][0]


def test_bad_ratios_and_fields_exit_2(tmp_path, cli):
    data = write_jsonl(tmp_path / "d.jsonl", [{"cid": "a", "x": 1}, {"x": 2}])
    for bad, text in (("0.8,0.3", "sum to 1.1, not 1"), ("0.8,-0.1,0.3", "none negative"), ("a,b", "not a list")):
        res = cli("split", data, "--by", "cid", "--ratios", bad, "--out", tmp_path / "o")
        assert res.code == 2 and text in res.err, res.err
    res = cli("split", data, "--by", "cid", "--out", tmp_path / "o")
    assert res.code == 2 and "d.jsonl:2" in res.err and "no field 'cid' (named by --by)" in res.err
    res = cli("split", data, "--by", "x", "--period", "when", "--out", tmp_path / "o")
    assert res.code == 2 and "no field 'when' (named by --period)" in res.err
    # a unit with no value (null, a pandas NaN, blank) cannot be placed: as a value, all were one unit "null"
    empty = write_jsonl(tmp_path / "e.jsonl", [{"cid": "a", "x": 1}, {"cid": None, "x": 2}, {"cid": " ", "x": 3},
                                               {"cid": float("nan"), "x": 4}])
    res = cli("split", empty, "--by", "cid", "--out", tmp_path / "o")
    assert res.code == 2, res.err
    assert "3 of 4 records in" in res.err and "have no value for 'cid' (named by --by: null, NaN or blank), e.g. " \
        f"{empty}:2, {empty}:3, {empty}:4" in res.err and "split without --by" in res.err
    assert not (tmp_path / "o").exists()  # nothing written on bad input


def test_records_with_no_unit_field_split_by_record_and_a_list_unit_stays_whole(tmp_path, cli):
    """Issue 43: split demanded --by for records with no unit field (here question/answer pairs, the second instance:
    the issue's were chat records); without it each record is its own unit, an exact copy lands with its twin. A
    list field as the unit (who took part) is one value taken whole: records with equal lists share a split."""
    pairs = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(40)]
    twins = pairs + [dict(pairs[3]), dict(pairs[17])]
    data = write_jsonl(tmp_path / "pairs.jsonl", twins)
    res = cli("split", data, "--ratios", "0.8,0.2", "--out", tmp_path / "r", "--json")
    assert res.code == 0, res.err
    parts = _read(tmp_path / "r")
    assert sum(map(len, parts.values())) == 42 and set(parts) == {"train", "validation"}
    for twin in (pairs[3], pairs[17]):
        assert [s for s, rs in parts.items() if twin in rs] in (["train"], ["validation"])
        assert sum(rs.count(twin) for rs in parts.values()) == 2
    assert "split by record" in res.json["summary"] and "group_by" not in "\n".join(res.json["messages"])

    people = [{"text": f"t{i}", "with": sorted({f"p{i % 7}", f"p{i % 3}"})} for i in range(60)]
    res = cli("split", write_jsonl(tmp_path / "people.jsonl", people), "--by", "with", "--out", tmp_path / "l",
              "--json")
    assert res.code == 0, res.err
    where = {}
    for s, rs in _read(tmp_path / "l").items():
        for r in rs:
            where.setdefault(json.dumps(r["with"]), set()).add(s)
    assert all(len(s) == 1 for s in where.values()) and len(where) == len({json.dumps(r["with"]) for r in people})
    assert len(set().union(*where.values())) > 1, where


def test_a_parquet_file_with_dates_splits_and_its_float_ids_stay_whole(tmp_path, cli):
    # pyarrow gives datetimes, dates and decimals, which json.dumps refused (exit 3); ids pandas wrote as floats are
    # the units they are as ints (leakage compares them so)
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": f"q{i}", "output": f"a{i}", "patient": float(i % 10),
             "seen": dt.datetime(2024, 1, 1 + i % 28), "day": dt.date(2024, 2, 1 + i % 28), "dose": Decimal("1.25")}
            for i in range(60)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "all.parquet")
    res = cli("split", tmp_path / "all.parquet", "--by", "patient", "--period", "seen", "--out", tmp_path / "s",
              "--json")
    assert res.code == 0, res.err
    parts = _read(tmp_path / "s")
    assert sum(map(len, parts.values())) == 60
    first = parts["train"][0]
    assert first["seen"].startswith("2024-01-") and "T00:00:00" in first["seen"] and first["day"].startswith("2024-02-")
    assert first["dose"] == "1.25"
    units = {s: {r["patient"] for r in rs} for s, rs in parts.items()}
    assert not (units["train"] & units["validation"]) and not (units["train"] & units["test"])
    res = cli("split", tmp_path / "all.parquet", "--by", "day", "--out", tmp_path / "d")
    assert res.code == 0, res.err


def test_split_replaces_only_what_an_earlier_split_wrote(tmp_path, cli):
    # `split data/train.jsonl --out data/` replaced the records it split with 80 % of them, and `--out data/` the
    # user's own validation.jsonl; a 0.9,0.1 split over a 0.8,0.1,0.1 one left the old test.jsonl, whose records are
    # now in train. What split wrote is in OUT/split.json with each file's sha256: only those are replaced
    recs = _records()
    data = write_jsonl(tmp_path / "data" / "train.jsonl", recs)
    before = data.read_bytes()
    r = cli("split", data, "--out", tmp_path / "data")
    assert r.code == 2 and "the DATA being split" in r.err and data.read_bytes() == before, r.err
    mine = write_jsonl(tmp_path / "data" / "validation.jsonl", recs[:3])
    whole = write_jsonl(tmp_path / "all.jsonl", recs)
    r = cli("split", whole, "--out", tmp_path / "data")
    assert r.code == 2 and f"{data}: split did not write this file" in r.err, r.err
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["train.jsonl", "validation.jsonl"]
    assert data.read_bytes() == before and len(mine.read_text().splitlines()) == 3

    out = tmp_path / "s"
    assert cli("split", whole, "--out", out).code == 0  # the clean case, then over its own files
    ledger = json.loads((out / "split.json").read_text())
    assert ledger["ratios"] == [0.8, 0.1, 0.1] and set(ledger["files"]) == {"train.jsonl", "validation.jsonl",
                                                                              "test.jsonl"}
    r = cli("split", whole, "--out", out, "--ratios", "0.9,0.1", "--seed", "3")
    assert r.code == 0, r.err
    assert f"removed {out / 'test.jsonl'}: an earlier split's, and this split has no test part" in r.out
    assert sorted(_read(out)) == ["train", "validation"]
    assert "pending" not in json.loads((out / "split.json").read_text())
    with open(out / "train.jsonl", "a") as f:  # edited by hand since: no longer what split wrote
        f.write(json.dumps(recs[0]) + "\n")
    r = cli("split", whole, "--out", out)
    assert r.code == 2 and "or it changed since" in r.err and not (out / "test.jsonl").exists(), r.err
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "split.json").write_text("{}")
    r = cli("split", whole, "--out", tmp_path / "t")
    assert r.code == 2 and "holds a split.json that split did not write" in r.err, r.err
    ledger["files"]["train.jsonl"] = []  # edited into another type: it lists nothing (was a TypeError, exit 3)
    (out / "split.json").write_text(json.dumps(ledger))
    r = cli("split", whole, "--out", out)
    assert r.code == 2 and f"{out / 'train.jsonl'}: split did not write this file" in r.err, r.err


def test_a_split_folder_or_its_ledger_named_as_data_names_the_file_to_use(tmp_path, cli):
    # data.train: the folder split wrote was "a folder holding 4 data files" (its split.json counted as one), and
    # data.validation: its split.json "must hold a list of objects"; each now names the split's file for the key
    out = tmp_path / "s"
    assert cli("split", write_jsonl(tmp_path / "all.jsonl", _records()), "--out", out).code == 0
    campaign = _campaign(tmp_path, out)
    r = cli("validate", campaign, "--set", f"data.train={out}")
    assert r.code == 2 and "is a folder that split wrote (train.jsonl, validation.jsonl, test.jsonl)" in r.err, r.err
    assert f"fix: set data.train to {out / 'train.jsonl'}" in r.err
    r = cli("validate", campaign, "--set", f"data.validation={out / 'split.json'}")
    assert r.code == 2 and "is the split.json that split writes beside its files" in r.err, r.err
    assert f"fix: set data.validation to {out / 'validation.jsonl'}" in r.err
    assert cli("validate", campaign).code == 0  # the split's own files (the clean case)
