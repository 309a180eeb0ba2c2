"""Leakage through formatting: copies of real records (shared/data/alpaca_tiny.json) whose punctuation was
retyped or removed, made typographic or full-width, are exact duplicates (fail); lightly retyped copies (that
and one word changed) are near duplicates (warn); distinct records pass. Before the normalisation (NFKC, case,
punctuation, whitespace) none of these copies was found."""

from __future__ import annotations

import json
import re

import pytest
from conftest import SHARED_DATA, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.data.leakage import exact_key, normalise
from pilotrun.rehearsal.data_checks.leakage import leakage


def _alpaca() -> list[dict]:
    recs = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    return [{"instruction": (r["instruction"] + "\n" + r["input"]).strip(), "output": r["output"]} for r in recs]


def _words(r: dict) -> int:
    return len((r["instruction"] + " " + r["output"]).split())


def _retype(text: str, i: int) -> str:
    """Punctuation retyped the ways copies drift: typographic quotes and dashes, commas and full stops
    removed or doubled, an ellipsis character, full-width letters in one word, other case and spacing."""
    t = text.replace('"', "“").replace("'", "’").replace(" - ", " — ").replace("...", "…")
    t = t.replace(", ", " ,  ") if i % 2 else t.replace(",", "")
    t = t.replace(". ", "! ") if i % 3 == 0 else t.replace(". ", ".  ")
    t = t.upper() if i % 5 == 0 else t
    words = t.split(" ")
    k = min(1, len(words) - 1)
    words[k] = "".join(chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch for ch in words[k])  # full-width
    return " ".join(words) + ("." if not t.endswith(".") else "")


def _reword(text: str) -> str:
    """One word in the middle replaced: a light edit on top of the retyping."""
    words = text.split(" ")
    words[len(words) // 2] = "zyzzyva"
    return " ".join(words)


def test_normalisation_is_nfkc_case_punctuation_whitespace():
    assert normalise("Hello,   World! «Ça» — it’s “fine”…  ＡＢＣ １２３") == "hello world ça it s fine abc 123"
    assert exact_key(normalise("it's a, b")) == exact_key(normalise("its a,b"))
    # symbols and digits carry meaning: they stay
    assert normalise("2+3=5 costs $4") == "2+3=5 costs $4"
    assert exact_key(normalise("add 2+3")) != exact_key(normalise("add 2=3"))


def test_copies_with_retyped_punctuation_are_exact_duplicates(tmp_path):
    recs = _alpaca()
    train, held = recs[:70], recs[70:]
    copies = [{"instruction": _retype(r["instruction"], i), "output": _retype(r["output"], i + 1)}
              for i, r in enumerate(train[:20])]
    assert all(c["instruction"] != r["instruction"] for c, r in zip(copies, train))  # the copies do differ
    result = leakage(load_campaign(tiny_causal_campaign(tmp_path, train, held + copies)))
    assert result.verdict == "fail", result.messages
    [hit] = [c for c in result.data["checks"] if c["name"] == "exact-duplicates"]
    assert hit["data"]["count"] == 20, hit
    assert (f"20 of {len(held) + 20} ({20 / (len(held) + 20):.1%}) validation units repeat a train unit exactly "
            "after normalising Unicode (NFKC), case, punctuation and whitespace") in hit["message"]


def test_lightly_retyped_copies_are_near_duplicates(tmp_path):
    recs = _alpaca()
    long = [r for r in recs if _words(r) >= 40]
    train, planted = long[:40], long[:40]
    copies = [{"instruction": _retype(r["instruction"], i), "output": _reword(_retype(r["output"], i + 1))}
              for i, r in enumerate(planted)]
    others = [r for r in recs if _words(r) < 40][:20]  # distinct records, found by neither check
    result = leakage(load_campaign(tiny_causal_campaign(tmp_path, train, others + copies)))
    assert result.verdict == "warn", result.messages  # near, not exact: the reworded copies are no exact match
    assert not [c for c in result.data["checks"] if c["name"] == "exact-duplicates"]
    [hit] = [c for c in result.data["checks"] if c["name"] == "near-duplicates"]
    recall = hit["data"]["count"] / len(copies)
    assert recall >= 0.9, hit  # the light copies found at the default threshold 0.8
    assert hit["data"]["count"] <= len(copies)  # and none of the distinct records
    assert "near duplicates of train units (estimated Jaccard ≥ 0.8 over 3-word shingles)" in hit["message"]


def test_distinct_real_records_pass(tmp_path):
    recs = _alpaca()
    result = leakage(load_campaign(tiny_causal_campaign(tmp_path, recs[:70], recs[70:])))
    assert result.verdict == "ok", result.messages
