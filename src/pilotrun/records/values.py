"""Field values as one key and as JSON, whatever file they came from.

A unit of ``data.group_by`` (a patient, a conversation, a document) is the same unit in every split and every file
format, so the split, the leakage check and the tasks compare it through one key (``unit_key``). A Parquet column that
pandas wrote with a missing value holds floats (17.0) where a JSONL file holds ints (17) and a CSV file text ("17"):
compared as ``str()``, patient 17 of train and patient 17 of validation were two units, and ``leakage`` said nothing
crosses (pandas writes such a column to CSV as "17.0" too). Parquet also gives dates, times and decimals, which
``json.dumps`` refuses (``split`` of such a file was an internal error); ``json_value`` writes them as JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from decimal import Decimal
from typing import Any

from pilotrun.errors import BadInput


def json_value(value: Any) -> Any:
    """``json.dumps``' ``default``: a date, time or datetime as its ISO text, a decimal as its exact text; anything
    else is bad input (a JSON line cannot hold it)."""
    if isinstance(value, (dt.date, dt.time)):  # a datetime is a date
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    raise BadInput(f"a value of type {type(value).__name__} cannot be written as JSON",
                   fix="convert the column to text or numbers before splitting")


_WHOLE_TEXT = re.compile(r"-?[0-9]+\.0+")


def unit_key(value: Any) -> str:
    """The one key of a unit's value: text as it is, but for a whole number written with a point ("17.0"); a whole
    number as its digits, whether an int, a float (17.0) or a decimal; booleans and null as JSON writes them; dates as
    ISO text; lists and objects as JSON with sorted keys (two records share a unit when their values are equal)."""
    if isinstance(value, str):  # "17.0": a float column pandas wrote to CSV, where the JSONL file says 17
        return value[: value.index(".")] if _WHOLE_TEXT.fullmatch(value) else value
    if isinstance(value, (float, Decimal)) and math.isfinite(value) and value == int(value):
        return str(int(value))
    if isinstance(value, (dt.date, dt.time, Decimal)):
        return json_value(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=json_value)


def no_unit(value: Any) -> bool:
    """Whether a record's unit value says nothing: null, NaN (a missing id in a pandas float column) or blank text.
    Taken as a value, every such record of a file was one unit, "null": the split put all of them in one split, and
    leakage reported 'null' as a unit both splits share."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, float) and math.isnan(value))
