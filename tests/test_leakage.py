"""Leakage across splits: each planted leak is caught (verdict and message); the clean demo passes."""

import json

import numpy as np
import pytest
import yaml
from conftest import tiny_causal_campaign, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.data import minhash
from pilotrun.data.leakage import normalise
from pilotrun.rehearsal.all import STAGES
from pilotrun.rehearsal.data_checks.leakage import leakage

LONG = ("the quick brown fox jumps over the lazy dog while the farmer watches from the old wooden "
        "porch and drinks his morning coffee slowly before the long day of work in the fields begins")


def _one(result, name):
    hits = [c for c in result.data["checks"] if c["name"] == name]
    assert len(hits) == 1, result.messages
    return hits[0]


def test_clean_demo_passes(demo_campaign, cli):
    result = leakage(load_campaign(demo_campaign))
    assert result.verdict == "ok", result.messages
    assert "nothing crosses train / validation / test" in result.summary
    res = cli("leakage", demo_campaign, "--json")
    assert res.code == 0 and res.json["data"]["unit"] == "conversation_id"
    # how far it is (hashing and MinHash of millions of records is minutes): each split read, then the comparison
    said = [ln.split(" (")[0] for ln in res.err.splitlines() if ln.startswith("pilotrun leakage: ")]
    assert said == ["pilotrun leakage: started", "pilotrun leakage: reading train",
                    "pilotrun leakage: reading validation", "pilotrun leakage: reading test",
                    "pilotrun leakage: comparing train / validation / test", "pilotrun leakage: ended"], res.err


def test_inspect_and_leakage_join_all_after_validate():
    names = [n for n, _ in STAGES]
    assert names[:3] == ["validate", "inspect", "leakage"]


def test_conversation_in_train_and_test(demo_dir):
    train = [json.loads(x) for x in (demo_dir / "data" / "train.jsonl").read_text().splitlines()]
    conv = train[0]["conversation_id"]
    test_path = demo_dir / "data" / "test.jsonl"
    leaked = [r for r in train if r["conversation_id"] == conv][:1]  # one turn of it is enough
    test_path.write_text(test_path.read_text() + "".join(json.dumps(r) + "\n" for r in leaked))
    result = leakage(load_campaign(demo_dir / "campaign.yaml"))
    assert result.verdict == "fail"
    hit = _one(result, "shared-units")
    assert hit["split"] == "test" and hit["data"]["values"] == [conv]
    n_test = len({json.loads(x)["conversation_id"] for x in test_path.read_text().splitlines()})
    assert (f"1 of {n_test} ({1 / n_test:.1%}) test units of 'conversation_id' (data.group_by) also occur in "
            f"train, e.g. '{conv}'") in hit["message"]
    assert "pilotrun split DATA --by conversation_id" in hit["message"]


def test_same_text_with_different_whitespace(tmp_path):
    train = [{"instruction": "Reverse  the word\tapple", "output": "elppa"},
             {"instruction": "add 2 3", "output": "5"}]
    val = [{"instruction": "reverse the WORD apple ", "output": "elppa"},
           {"instruction": "upper pear", "output": "PEAR"}]
    result = leakage(load_campaign(tiny_causal_campaign(tmp_path, train, val)))
    assert result.verdict == "fail"
    hit = _one(result, "exact-duplicates")
    assert hit["split"] == "validation"
    assert ("1 of 2 (50.0%) validation units repeat a train unit exactly after normalising Unicode (NFKC), case, "
            "punctuation and whitespace") in hit["message"]
    assert "validation.jsonl:1 = " in hit["message"] and "train.jsonl:1" in hit["message"]
    assert not [c for c in result.data["checks"] if c["name"] == "near-duplicates"]


def test_near_duplicate_across_splits(tmp_path):
    near = LONG.replace("morning", "evening")
    train = [{"instruction": "tell a story", "output": LONG}, {"instruction": "add 2 3", "output": "5"}]
    val = [{"instruction": "tell a story", "output": near}, {"instruction": "upper pear", "output": "PEAR"}]
    path = tiny_causal_campaign(tmp_path, train, val)
    result = leakage(load_campaign(path), threshold=0.7)
    assert result.verdict == "warn"
    hit = _one(result, "near-duplicates")
    assert "1 of 2 (50.0%) validation units are near duplicates of train units (estimated Jaccard ≥ 0.7" \
        in hit["message"]
    assert "validation.jsonl:1 ~ " in hit["message"] and "train.jsonl:1 (J≈" in hit["message"]
    assert leakage(load_campaign(path), threshold=0.99).verdict == "ok"  # the threshold is a setting


def test_test_period_before_train(tmp_path):
    train = [{"instruction": f"q{i}", "output": f"a{i}", "month": f"2023-0{i + 1}"} for i in range(6)]
    val = [{"instruction": "v1", "output": "x", "month": "2023-07"}]
    path = tiny_causal_campaign(tmp_path, train, val, data__period_by="month")
    write_jsonl(tmp_path / "data" / "test.jsonl", [{"instruction": "t1", "output": "y", "month": "2022-01"},
                                                   {"instruction": "t2", "output": "z", "month": "2022-03"}])
    c = yaml.safe_load(path.read_text())
    c["data"]["test"] = "data/test.jsonl"
    write_campaign(tmp_path, c)
    result = leakage(load_campaign(path))
    assert result.verdict == "fail"
    hit = _one(result, "period-order")
    assert hit["split"] == "test"
    assert "test periods 2022-01..2022-03 precede train periods 2023-01..2023-06" in hit["message"]
    assert "2 of 2 (100.0%) test records at or before the last train period" in hit["message"]
    c["data"]["test"] = None
    write_campaign(tmp_path, c)
    assert leakage(load_campaign(path)).verdict == "ok"  # validation 2023-07 comes after train


def test_missing_group_by_field_is_bad_input(tmp_path, cli):
    train = [{"instruction": "a", "output": "b", "cid": "1"}, {"instruction": "c", "output": "d"}]
    path = tiny_causal_campaign(tmp_path, train, [{"instruction": "e", "output": "f", "cid": "2"}],
                                data__group_by="cid")
    res = cli("leakage", path)
    assert res.code == 2
    assert "train.jsonl:2" in res.err and "no field 'cid' (named by data.group_by)" in res.err


def test_minhash_estimates_jaccard():
    """The vectorised signatures estimate the Jaccard similarity of word 3-gram shingle sets."""
    def shingles(t):
        w = normalise(t).split()
        return {tuple(w[i:i + minhash.SHINGLE]) for i in range(len(w))}

    words = LONG.split()
    texts = [LONG] + [" ".join(words[:k] + ["zzz"] + words[k + 1:]) for k in (5, 12)] + \
        [" ".join(words[: len(words) // 2]), "something else entirely"]
    sig = minhash.signatures([normalise(t) for t in texts])
    for j in range(1, len(texts)):
        a, b = shingles(texts[0]), shingles(texts[j])
        exact = len(a & b) / len(a | b)
        est = float((sig[:, 0] == sig[:, j]).mean())
        assert abs(est - exact) < 0.2, (j, exact, est)
    assert (minhash.signatures(["", "a"])[:, 0] == minhash.EMPTY).all()
    ia, ib, sim = minhash.near_pairs(sig[:, :1], sig[:, 1:], 0.5)
    assert list(ib) == [0, 1] and np.all(sim >= 0.5)


def test_unit_signature_does_not_depend_on_where_the_units_records_lie(tmp_path):
    """A unit's records together or scattered through the file (the sorted fast path and the reordering
    path) give the same unit hashes and signatures, and the unit is reported at its first record."""
    from pilotrun.data.leakage import reduce_split
    from pilotrun.records.stream import iter_chunks

    turns = [{"conv": f"c{k}", "instruction": f"{LONG} {k} {t}", "output": f"a{t}"} for k in range(5) for t in range(3)]
    scattered = sorted(turns, key=lambda r: (r["output"], r["conv"]))  # c0 c1 ... c4, then again
    units = {}
    for name, records in (("together", turns), ("scattered", scattered)):
        c = load_campaign(tiny_causal_campaign(tmp_path / name, records, data__group_by="conv")).campaign
        units[name] = reduce_split(c, "train", iter_chunks(c.data.train, size=4))
    a, b = units["together"], units["scattered"]
    assert a.names == b.names == [f"c{k}" for k in range(5)]
    assert np.array_equal(a.digest, b.digest) and np.array_equal(a.sig, b.sig)
    assert a.where[1].endswith("train.jsonl:4") and b.where[1].endswith("train.jsonl:2")


def test_a_unit_is_one_unit_whatever_file_holds_it(tmp_path):
    # pandas writes an id column that had a missing value as floats: patient 3 is 3.0 in the Parquet training file,
    # 3 in the JSONL validation file and "3" in a CSV; compared as str(), no patient crossed
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tiny_causal_campaign(tmp_path, [{"instruction": "x", "output": "y"}])
    rows = [{"instruction": f"train question {i}", "output": f"answer {i}", "patient": float(i % 6)} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "train.parquet")
    write_jsonl(tmp_path / "data" / "validation.jsonl",
                [{"instruction": f"held-out question {i}", "output": f"reply {i}", "patient": i} for i in (3, 40)])
    (tmp_path / "data" / "test.csv").write_text("instruction,output,patient\nanother question,a reply,5.0\n")
    c = yaml.safe_load(path.read_text())
    c["data"].update(train="data/train.parquet", validation="data/validation.jsonl", test="data/test.csv",
                     group_by="patient")
    write_campaign(tmp_path, c)
    result = leakage(load_campaign(path))
    assert result.verdict == "fail"
    hits = {c["split"]: c for c in result.data["checks"] if c["name"] == "shared-units"}
    assert hits["validation"]["data"]["values"] == ["3"] and hits["test"]["data"]["values"] == ["5"]
    assert "1 of 2 (50.0%) validation units of 'patient' (data.group_by) also occur in train" \
        in hits["validation"]["message"]


def test_unit_keys():
    import datetime as dt
    from decimal import Decimal

    from pilotrun.records.values import unit_key

    assert unit_key(17) == unit_key(17.0) == unit_key("17") == unit_key(Decimal("17.00")) == "17"
    assert unit_key(17.5) == "17.5" and unit_key(float("nan")) == "NaN" and unit_key(10 ** 16) == unit_key(1e16)
    assert unit_key("17.0") == unit_key("17.000") == "17" and unit_key("-3.0") == "-3" and unit_key("017.0") == "017"
    assert unit_key("17.5") == "17.5" and unit_key("1e3") == "1e3" and unit_key("v17.0") == "v17.0"
    assert unit_key(True) == "true" and unit_key(None) == "null" and unit_key("017") == "017"
    assert unit_key(dt.date(2024, 1, 2)) == "2024-01-02"
    assert unit_key({"b": 1, "a": [2, dt.date(2024, 1, 2)]}) == unit_key({"a": [2, dt.date(2024, 1, 2)], "b": 1})


def test_records_with_no_unit_are_named_and_never_one_shared_unit(tmp_path):
    # null, NaN and blank ids were one unit "null" per split: reported as a unit train and validation share (and
    # where only one split lacked ids, nothing was said); each is now its own unit, compared by its text, and named
    train = [{"instruction": f"train question {i}", "output": f"answer {i}", "patient": [None, 1, 2, float("nan")][i]}
             for i in range(4)]
    val = [{"instruction": f"held-out question {i}", "output": f"reply {i}", "patient": [None, "  ", 7][i]}
           for i in range(3)]
    path = tiny_causal_campaign(tmp_path, train, val, data__group_by="patient")
    result = leakage(load_campaign(path))
    assert result.verdict == "warn", result.messages
    assert not [c for c in result.data["checks"] if c["name"] == "shared-units"]
    hits = {c["split"]: c for c in result.data["checks"] if c["name"] == "no-unit"}
    train_path, val_path = tmp_path / "data" / "train.jsonl", tmp_path / "data" / "validation.jsonl"
    assert hits["train"]["message"].startswith(
        f"2 of 4 (50.0%) train records have no value for 'patient' (data.group_by: null, NaN or blank), e.g. "
        f"{train_path}:1, {train_path}:4")
    assert hits["validation"]["data"]["records"] == [f"{val_path}:1", f"{val_path}:2"]
    # a copy among them is still found by its text
    write_jsonl(val_path, val + [dict(train[0])])
    result = leakage(load_campaign(path))
    hit, = [c for c in result.data["checks"] if c["name"] == "exact-duplicates"]
    assert f"{val_path}:4 = {train_path}:1" in hit["message"]


@pytest.mark.parametrize("missing", [float("nan"), None, ""])
def test_a_record_with_no_period_is_left_out_of_the_order_and_named(tmp_path, missing):
    # a NaN first in train made its range nan..nan (validation 'overlapped' it); a null turned every period to text,
    # where "None" sorts after "2023-06"; blank alike: each gave a false period-order fail
    months = [missing] + [f"2023-0{i}" for i in range(1, 6)]
    train = [{"instruction": f"q{i}", "output": f"a{i}", "month": m} for i, m in enumerate(months)]
    val = [{"instruction": "v1", "output": "x", "month": "2023-07"}]
    path = tiny_causal_campaign(tmp_path, train, val, data__period_by="month")
    result = leakage(load_campaign(path))
    assert not [c for c in result.data["checks"] if c["name"] == "period-order"], result.messages
    hit = _one(result, "no-period")
    assert hit["verdict"] == "warn" and hit["split"] == "train"
    assert hit["message"].startswith(f"1 of 6 (16.7%) train records have no value for 'month' (data.period_by: null, "
                                     f"NaN or blank), e.g. {tmp_path / 'data' / 'train.jsonl'}:1")
    write_jsonl(tmp_path / "data" / "validation.jsonl",
                val + [{"instruction": "v2", "output": "y", "month": "2023-02"}])
    hit = _one(leakage(load_campaign(path)), "period-order")  # a real overlap is still one
    assert "validation periods 2023-02..2023-07 overlap train periods 2023-01..2023-05" in hit["message"]


@pytest.mark.parametrize("val_month, said", [
    # day-first or month-first dates sort by their first number: 12/01/2022 after 01/15/2023
    ("07/01/2023", "its values are dates not written as ISO dates ('01/01/2023'): compared as text they sort by their "
                   "first part"),
    # one value of another kind turned every period to text
    ("July 2023", "its values are not of one kind (an ISO date: '2023-01'; text: 'July 2023')"),
])
def test_periods_without_a_time_order_are_named_not_compared_as_text(tmp_path, val_month, said):
    import datetime

    us = val_month.count("/") == 2
    months = [datetime.date(2023, i, 1).strftime("%m/%d/%Y" if us else "%Y-%m") for i in range(1, 7)]
    train = [{"instruction": f"q{i}", "output": f"a{i}", "month": m} for i, m in enumerate(months)]
    val = [{"instruction": "v1", "output": "x", "month": val_month}]
    path = tiny_causal_campaign(tmp_path, train, val, data__period_by="month")
    result = leakage(load_campaign(path))
    assert result.verdict == "fail" and not [c for c in result.data["checks"] if c["name"] == "period-order"]
    hit = _one(result, "period-format")
    assert hit["message"].startswith(f"data.period_by 'month': {said}"), hit["message"]
    assert hit["message"].endswith("the period order cannot be checked: write every 'month' as an ISO date "
                                   "(2023-02-15) or a number")
    # the clean case: the same months, every one an ISO date, are ordered (validation after train: nothing to say)
    write_jsonl(tmp_path / "data" / "train.jsonl", [dict(r, month=f"2023-0{i + 1}") for i, r in enumerate(train)])
    write_jsonl(tmp_path / "data" / "validation.jsonl", [dict(val[0], month="2023-07")])
    result = leakage(load_campaign(path))
    assert result.verdict == "ok" and not [c for c in result.data["checks"] if c["name"].startswith("period")]
