"""What a plan costs, from a small rates file the user keeps (``sheet --rates FILE``).

```yaml
currency: USD        # optional; printed beside every cost
h100-sxm: 2.49       # catalogue key (or the GPU's name): price per GPU-hour
a100-80gb:
  hour: 1.29         # per GPU-hour, for plans without their own price
  7: 190.0           # price per GPU for the whole 7-day plan (a reserved-term offer)
interconnect:        # optional: what you rent; the options' communication time uses it
  intra_node_gbs: 150   # all-reduce bus bandwidth per GPU inside a node, GB/s
  inter_node_gbs: 50    # between nodes, GB/s per GPU (400 Gb/s InfiniBand or EFA per GPU = 50)
```
A whole-day plan's cost is its price for ``hardware.gpus`` GPUs: the plan's own price when the file gives one,
else the hourly price × 24 × days. One rule (``rent``) prices both the sheet's headline and every row of
the options table: the campaign's hours × GPUs × the hourly price (the hourly plan), or a whole-day plan
whose days less ``hardware.reserve`` hold the campaign, whichever is cheapest. The cheapest plan is that
rule's lowest cost over every rated GPU that fits the campaign.
"""

from __future__ import annotations

import math
from pathlib import Path

from pilotrun.campaign.yamlsafe import load_bounded
from pilotrun.errors import NUMBER, BadInput, comma_number_fix, utf8_of
from pilotrun.sheet.catalogue import BY_KEY, match_gpu

FORMAT = ("a YAML mapping of GPU → price per GPU-hour, or GPU → {hour: PRICE, DAYS: PRICE of the whole "
          "plan per GPU}; e.g. `h100-sxm: 2.49`")


def _lines(node) -> dict[str, int]:
    """Each top-level key's line, from the document ``load_bounded`` composed."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in node.value}


def _gpu_named(name):
    """The catalogue GPU a rates file's key names: a catalogue key, or the GPU's name (H100 → h100-sxm)."""
    return BY_KEY.get(str(name).lower()) or match_gpu(str(name))


def _number(v) -> float | None:
    """A finite number as written: YAML's int or float, or a string YAML 1.1 leaves unread (``1e-9``, ``2E3``: an
    exponent without a dot); None for anything else (a bool, ``2 USD``, .nan, .inf)."""
    if isinstance(v, str) and NUMBER.fullmatch(v):
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _price(v, where: str) -> float:
    x = _number(v)
    if x is None or x < 0:
        raise BadInput(f"price {v!r} is not a number >= 0", where=where, fix=comma_number_fix(v, whole=False) or FORMAT)
    return x


def _currency(v, where: str) -> str:
    """The currency printed beside every cost: a short word or symbol (USD, €); not markup or a table's separator,
    which the sheet's Markdown and HTML would carry."""
    if not isinstance(v, (str, int)) or isinstance(v, bool) or len(str(v)) > 12 or any(
            ch in "|<>&`\\" or not ch.isprintable() for ch in str(v)):
        raise BadInput(f"currency {v!r} is not a short word or symbol", where=f"{where}: currency",
                       fix="write it like USD, EUR or € (at most 12 characters, no | < > & ` \\)")
    return str(v)


NET_KEYS = ("intra_node_gbs", "inter_node_gbs")


def _interconnect(v, where: str) -> dict:
    """``interconnect: {intra_node_gbs, inter_node_gbs}``: GB/s per GPU, each optional."""
    fix = "write `interconnect: {intra_node_gbs: 150, inter_node_gbs: 50}` (GB/s per GPU; either may be left out)"
    if not isinstance(v, dict):
        raise BadInput(f"interconnect is {v!r}, not a mapping", where=f"{where}: interconnect", fix=fix)
    unknown = [k for k in v if k not in NET_KEYS]
    if unknown:
        raise BadInput(f"unknown key(s) {', '.join(map(repr, unknown))}", where=f"{where}: interconnect", fix=fix)
    out = {"where": where}
    for k in NET_KEYS:
        x = v.get(k)
        gbs = None if x is None else _number(x)
        if x is not None and (gbs is None or gbs <= 0):
            raise BadInput(f"{k} {x!r} is not a bandwidth > 0 (GB/s per GPU)",
                           where=f"{where}: interconnect.{k}", fix=fix)
        out[k] = gbs
    return out


def read_rates(path: str | Path) -> dict:
    """{"path", "currency", "gpus": {catalogue key: {"hour": float | None, "plans": {days: float}}}}."""
    p = Path(path)
    if not p.is_file():
        raise BadInput("rates file not found", where=str(p), fix=f"write {FORMAT}")
    text = utf8_of(p.read_bytes(), p)
    doc, node = load_bounded(text, str(p))  # a key twice is refused (YAML keeps the last), as in the campaign file
    if not isinstance(doc, dict) or not doc:
        raise BadInput("not a mapping of GPU → price", where=str(p), fix=FORMAT)
    lines = _lines(node)
    out = {"path": str(p), "currency": _currency(doc.pop("currency", "") or "", f"{p}:{lines.get('currency', '?')}"),
           "gpus": {}}
    named: dict[str, str] = {}  # catalogue key -> the name the file priced it under
    priced = [k for k in doc if k != "interconnect"]
    if priced and not any(map(_gpu_named, priced)):
        campaign = len({"name", "task", "model", "data", "train", "plan", "hardware"} & set(doc)) >= 2
        raise BadInput(f"none of its keys names a GPU ({', '.join(map(str, priced[:4]))}"
                       f"{' …' if len(priced) > 4 else ''})" + (": it is a campaign file, not a rates file"
                                                                 if campaign else ""), where=str(p),
                       fix=f"pass --rates a rates file: {FORMAT}")
    if "interconnect" in doc:
        out["interconnect"] = _interconnect(doc.pop("interconnect"), f"{p}:{lines.get('interconnect', '?')}")
    for name, value in doc.items():
        where = f"{p}:{lines.get(str(name), '?')}: {name}"
        gpu = _gpu_named(name)
        if gpu is None:
            raise BadInput(f"no GPU {name!r} in the built-in catalogue", where=where,
                           fix=f"use a catalogue key: {', '.join(BY_KEY)}")
        if gpu.key in named:
            raise BadInput(f"{name!r} and {named[gpu.key]!r} both name {gpu.key} ({gpu.name}): one price would "
                           "silently replace the other", where=where, fix=f"keep one price for {gpu.key}")
        named[gpu.key] = str(name)
        if isinstance(value, dict):
            unknown = [k for k in value if k != "hour" and not (isinstance(k, int) and k > 0)]
            if unknown:
                raise BadInput(f"unknown key(s) {', '.join(map(repr, unknown))}", where=where,
                               fix="give `hour:` and/or whole-day plan lengths as keys (3: PRICE, 7: PRICE)")
            hour = _price(value["hour"], f"{where}.hour") if "hour" in value else None
            plans = {int(k): _price(v, f"{where}.{k}") for k, v in value.items() if k != "hour"}
            if hour is None and not plans:
                raise BadInput("no price", where=where, fix=FORMAT)
        else:
            hour, plans = _price(value, where), {}
        out["gpus"][gpu.key] = {"hour": hour, "plans": plans}
    return out


def plan_price(rate: dict, days: int, gpus: int) -> tuple[float | None, str]:
    """The price of a ``days`` plan on ``gpus`` GPUs and how it was computed; None without a price."""
    if days in rate["plans"]:
        return rate["plans"][days] * gpus, f"{days}-day price {rate['plans'][days]:g} × {gpus} GPU(s)"
    if rate["hour"] is not None:
        return rate["hour"] * 24 * days * gpus, f"{rate['hour']:g}/h × 24 × {days} days × {gpus} GPU(s)"
    return None, f"no {days}-day or hourly price"


def rent(rate: dict, seconds: float, gpus: int, reserve: float = 0.0, name: str = "") -> tuple[float | None, str, int | None]:
    """The one costing rule: the cheapest way to rent ``gpus`` GPUs for ``seconds`` of campaign time.

    The hourly plan (hours × GPUs × the hourly price), or any whole-day plan the rates file prices whose days
    less the ``reserve`` share hold the campaign (a plan priced only by the hour is never cheaper than the
    hourly plan). Returns (cost, how, days): days None for the hourly plan; cost None (and why) without a way."""
    hours = seconds / 3600
    ways = []
    if rate.get("hour") is not None:
        ways.append((hours * gpus * rate["hour"], 0,
                     f"{hours:.3g} h (campaign time) × {gpus} GPU(s) × {rate['hour']:g}/h", None))
    for d, price in sorted((rate.get("plans") or {}).items()):
        if seconds <= d * 86400 * (1 - reserve):
            ways.append((price * gpus, d, f"{d}-day plan {price:g} × {gpus} GPU(s) (campaign time {hours:.3g} h)", d))
    if not ways:
        return None, (f"no hourly price{' for ' + name if name else ''} and no plan of "
                      f"{hours / 24 / (1 - reserve):.3g} days or more"), None
    cost, _, how, d = min(ways)
    return cost, how, d


def costs(rates: dict, plans_by_gpu: dict[str, list[dict]], gpus: int, seconds_by_gpu: dict[str, float],
          reserve: float) -> dict:
    """Every rated GPU's plans with their cost (the hourly plan beside the whole-day plans), and the cheapest
    by ``rent``, the rule the options table's rows are priced by.

    ``plans_by_gpu``: catalogue key → its packed plans (sheet/plan.py ``pack``), for the GPUs that fit;
    ``seconds_by_gpu``: the campaign's wall time on ``gpus`` GPUs of each (every lane's runs done)."""
    rows, best = [], []
    for key, rate in rates["gpus"].items():
        if key not in plans_by_gpu:
            rows.append({"gpu": key, "days": None, "plan": "—", "cost": None, "how": "does not fit the campaign",
                         "fits_all": False, "placed": 0})
            continue
        seconds = seconds_by_gpu[key]
        if rate["hour"] is not None:  # the hourly plan: as long as the campaign, by the same rule
            cost = rent({"hour": rate["hour"]}, seconds, gpus)[0]
            rows.append({"gpu": key, "days": None, "plan": "hourly", "cost": cost, "fits_all": True,
                         "how": f"{seconds / 3600:.3g} h × {gpus} GPU(s) × {rate['hour']:g}/h",
                         "placed": max((len(p["placed"]) + len(p["not_fitting"]) for p in plans_by_gpu[key]),
                                       default=0)})
        for p in plans_by_gpu[key]:
            cost, how = plan_price(rate, p["days"], gpus)
            rows.append({"gpu": key, "days": p["days"], "plan": f"{p['days']} days", "cost": cost, "how": how,
                         "fits_all": p["fits_all"], "placed": len(p["placed"])})
        cost, how, days = rent(rate, seconds, gpus, reserve, key)
        if cost is not None:
            best.append({"gpu": key, "days": days, "plan": "hourly" if days is None else f"{days}-day",
                         "cost": cost, "how": how, "seconds": seconds})
    cheapest = min(best, key=lambda r: (r["cost"], r["days"] or 0)) if best else None
    return {"currency": rates["currency"], "path": rates["path"], "rows": rows, "cheapest": cheapest}
