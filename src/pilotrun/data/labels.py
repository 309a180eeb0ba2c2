"""seq-cls label checks: unknown class values (bad input), the model head's id2label order, class counts."""

from __future__ import annotations

from pathlib import Path

from pilotrun.errors import BadInput
from pilotrun import jsonsafe
from pilotrun.tasks.seq_cls import MULTI_LABEL_FIX, ONE_CLASS, as_id
from pilotrun.verdicts import Check

FEW = 3


def scan_labels(task, records: dict[str, list]) -> None:
    """Every label value must be a name in data.labels or an id 0..n-1; all unknown values are listed at once."""
    if getattr(task, "kind", None) != "seq-cls" or not hasattr(task, "label_id"):
        return
    name = task.c.data.label
    unknown: dict[str, list[str]] = {}
    values: dict[str, object] = {}  # each unknown value as shown, as written
    for recs in records.values():
        for r in recs:
            if name not in r.fields:
                task.label_id(r)  # raises the missing-field error with the record's location
            try:
                task.label_id(r)
            except BadInput:
                value = r.fields[name]  # a boolean as JSON writes it (false), not as Python does (False)
                shown = str(value).lower() if isinstance(value, bool) else repr(value)
                unknown.setdefault(shown, []).append(r.where)
                values[shown] = value
    if unknown:
        listed = "; ".join(f"{v} ({len(w)} records, first {w[0]})" for v, w in unknown.items())
        first = next(iter(unknown.values()))[0]
        yes_no = set(unknown) <= {"false", "true"}
        cased = _written_otherwise(values, task.labels)
        lists = [k for k, v in values.items() if isinstance(v, (list, tuple))]
        if lists:
            raise BadInput(f"{len(unknown)} label values are not in data.labels {task.labels}: {listed}; "
                           f"{len(lists)} of them are lists ({lists[0]} …): several classes a record (multi-label "
                           f"classification), {ONE_CLASS}", where=first, fix=MULTI_LABEL_FIX)
        fractions = [v for v in values.values() if isinstance(v, float) and not v.is_integer()]
        if fractions and len(fractions) * 2 >= len(values):  # 0.25, 0.5 …: a score to predict, not a class
            raise BadInput(f"{len(unknown)} label values are not in data.labels {task.labels}: {listed}; "
                           f"{len(fractions)} of them are fractions ({fractions[0]:g} …): a score to predict "
                           f"(regression), {ONE_CLASS}", where=first,
                           fix="give each record a class name of data.labels or its id 0..n-1 (bin the scores into "
                               "classes); regression is not a task pilotrun rehearses (a custom task, task: "
                               "package.module:TaskClass, can train its loss)")
        fix = ("name the classes \"false\" and \"true\" in data.labels, in the order of their ids" if yes_no else
               f"these are classes of data.labels written in another case or with spaces ({cased}; a CSV written by "
               "pandas says True and False): correct the records to the names data.labels gives, or name the classes "
               "as the records write them" if cased else
               "add these classes to data.labels (in id order), or correct the records")
        raise BadInput(f"{len(unknown)} label values are not in data.labels {task.labels}: {listed}"
                       + (" (yes/no values: JSON or Parquet booleans)" if yes_no else ""), where=first, fix=fix)


def _written_otherwise(values: dict[str, object], labels: list[str]) -> str | None:
    """``'True' → 'true'`` for each unknown value (shown → as written) that is one class of ``labels`` but for case
    and surrounding spaces, when every one of them is; else None (a class to add, not a spelling)."""
    pairs = []
    for shown, value in values.items():
        named = [n for n in labels if isinstance(value, str) and n.strip().casefold() == value.strip().casefold()]
        if len(named) != 1:
            return None
        pairs.append(f"{shown} → {named[0]!r}")
    return ", ".join(pairs)


def label_forms(task, records: dict[str, list]) -> list:
    """Class labels written two ways: names (of data.labels) in one split, ids in another (or both in one).
    A warning — unless a value reads as two different classes, a name whose digits are another class's id
    (data.labels ["1", "2", "3"]: the name "1" is id 0, the id 1 is "2"), with both forms in the data:
    then the splits disagree about what a class is, and it fails."""
    if getattr(task, "kind", None) != "seq-cls" or not hasattr(task, "label2id"):
        return []
    name, label2id = task.c.data.label, task.label2id
    forms: dict[str, dict[str, list]] = {}  # split -> form -> [(value, where)]
    for split, recs in records.items():
        for r in recs:
            value = r.fields.get(name)
            form = "name" if isinstance(value, str) and value in label2id else "id" if as_id(value) is not None \
                else None
            if form:
                forms.setdefault(split, {}).setdefault(form, []).append((value, r.where))
    named = {s: f["name"] for s, f in forms.items() if f.get("name")}
    ided = {s: f["id"] for s, f in forms.items() if f.get("id")}
    if not named or not ided:
        return []
    first_name = next(iter(named.values()))[0]
    first_id = next(iter(ided.values()))[0]
    how = (f"as class names in {', '.join(named)} (e.g. {first_name[0]!r} at {first_name[1]}) and as ids in "
           f"{', '.join(ided)} (e.g. {first_id[0]!r} at {first_id[1]})")
    clash = [(v, w) for recs in named.values() for v, w in recs if as_id(v) is not None and as_id(v) != label2id[v]]
    if clash:
        v, w = clash[0]
        i = label2id[v]
        other = task.labels[as_id(v)] if 0 <= as_id(v) < len(task.labels) else None
        return [Check("label-forms", "fail",
                      f"labels are written {how}, and the two readings disagree: {v!r} is the name of class {i} in "
                      f"data.labels {task.labels}, while the id {as_id(v)} is class "
                      + (f"{as_id(v)} ({other!r})" if other is not None else f"{as_id(v)}, which does not exist")
                      + f" ({len(clash)} records read as names, first {w}) — write every split's labels one way "
                      "(all names or all ids)", data={"named": list(named), "ids": list(ided), "clash": len(clash)})]
    return [Check("label-forms", "warn",
                  f"labels are written {how}; both read through data.labels {task.labels}, but a data set written "
                  "two ways usually comes from two sources — check that id i means data.labels[i] in both",
                  data={"named": list(named), "ids": list(ided)})]


def model_id2label(c) -> dict[int, str] | None:
    """The id2label of a pretrained model folder, unless it holds only the generic LABEL_i names."""
    if not c.model.path:
        return None
    path = Path(c.model.path) / "config.json"
    try:
        cfg = jsonsafe.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    raw = cfg.get("id2label") or {}
    names = {int(k): str(v) for k, v in raw.items()}
    if not names or all(v.startswith("LABEL_") for v in names.values()):
        return None
    return names


def head_name(c, class_id: int) -> str | None:
    """The name the model's config gives a class id (the pretrained head's, else data.labels')."""
    names = model_id2label(c)
    if names is not None:
        return names.get(class_id)
    labels = c.data.labels or []
    return labels[class_id] if 0 <= class_id < len(labels) else None


def label_checks(task, loaded, scans) -> list:
    if getattr(task, "kind", None) != "seq-cls":
        return []
    c = loaded.campaign
    labels = list(c.data.labels or [])
    out = []
    head = model_id2label(c)
    if head is not None and [head.get(i) for i in range(len(labels))] != labels:
        width = max(len(n) for n in labels + ["data.labels"])
        rows = [f"  id  {'data.labels':<{width}}  model id2label"]
        for i in range(max(len(labels), max(head) + 1)):
            mine = labels[i] if i < len(labels) else "-"
            mark = "" if head.get(i) == mine else "   ≠"
            rows.append(f"  {i:<3} {mine:<{width}}  {head.get(i, '-')}{mark}")
        same = sorted(head.values()) == sorted(labels)
        out.append(Check("id2label", "fail",
                         ("the model's id2label names the same classes in another order" if same else
                          "the model's id2label names other classes") +
                         f" than data.labels ({c.model.path}/config.json):\n" + "\n".join(rows) +
                         "\n  fix: order data.labels as the model's id2label, or train a new head",
                         data={"data_labels": labels, "model_id2label": {str(k): v for k, v in head.items()}}))
    counts = {}
    for split, s in scans.items():
        counts[split] = {labels[i] if 0 <= i < len(labels) else str(i): s.classes.get(i, 0)
                         for i in range(len(labels))}
        out.append(Check("classes", "ok", ", ".join(f"{k} {v}" for k, v in counts[split].items()), split,
                         {"counts": counts[split]}))
    for split in ("train", "validation"):
        missing = [k for k, v in counts.get(split, {}).items() if v == 0]
        if missing:
            out.append(Check("classes", "warn", f"{split} has no example of class {', '.join(map(repr, missing))}: "
                             + ("the model cannot learn it" if split == "train" else "its accuracy is never measured"),
                             split, {"missing": missing}))
    return out
