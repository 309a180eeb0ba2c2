"""The options table priced from a rates file (`estimate --options --rates`, the sheet without a pilot) and
as a section of the piloted sheet: Markdown, terminal widths, a pipe and the JSON envelope."""

from __future__ import annotations

import io
import math

import pytest
from conftest import tiny_causal_campaign
from test_options import _records
from test_sheet import campaign, record_pilot

from pilotrun.campaign.load import load_campaign
from pilotrun.rehearsal.rental.sheet import sheet_stage

GiB = 2**30
# the fastest GPUs priced far above a slower one: the cheapest by cost is not the fewest GPU-hours
RATES = "currency: USD\nh100-sxm: 100.0\nh200: 120.0\na100-80gb: 0.5\nl4: {7: 50.0}\n"


def _rates(tmp_path, text=RATES):
    path = tmp_path / "rates.yaml"
    path.write_text(text)
    return path


def test_row_cost_hourly_or_the_shortest_plan_that_covers_it():
    from pilotrun.sheet.options import row_cost

    rates = {"path": "r.yaml", "gpus": {"a100-80gb": {"hour": 2.0, "plans": {3: 100.0, 7: 150.0}},
                                        "l4": {"hour": None, "plans": {7: 50.0}}}}
    assert row_cost(rates, "a100-80gb", 3600 * 10, 4) == (80.0, "10 h (campaign time) × 4 GPU(s) × 2/h")
    cost, how = row_cost(rates, "a100-80gb", 3600 * 60, 1)  # 120 by the hour, the 3-day plan is 100
    assert cost == 100.0 and how.startswith("3-day plan 100 × 1 GPU(s)")
    assert row_cost(rates, "l4", 3600 * 24 * 8, 1) == (None, "no hourly price for l4 and no plan of 8 days or more")
    assert row_cost(rates, "h100-sxm", 60, 1) == (None, "no price for h100-sxm in r.yaml")
    assert row_cost(None, "l4", 60, 1)[0] is None


def test_estimate_options_with_rates_costs_every_row_and_recommends_by_cost(tmp_path, cli):
    path = tiny_causal_campaign(tmp_path, _records(24), _records(8, 100))
    done = cli("estimate", path, "--options", "--rates", _rates(tmp_path), "--json")
    assert done.code == 0, done.err
    data = done.json["data"]
    assert data["by"] == "cost" and data["currency"] == "USD"
    price = {"h100-sxm": 100.0, "h200": 120.0, "a100-80gb": 0.5}
    for r in data["rows"]:
        if r["gpu"] in price:
            assert math.isclose(r["cost"], r["seconds"] / 3600 * r["count"] * price[r["gpu"]]), r
            assert "h (campaign time)" in r["cost_how"]
        elif r["gpu"] == "l4":
            assert r["cost"] == 50.0 * r["count"] and r["cost_how"].startswith("7-day plan 50")
        else:
            assert r["cost"] is None and "no price for" in r["cost_how"]
    keep = [r for r in data["rows"] if r["fits"] and r["keeps"]]
    rec = data["recommended"]
    assert rec["cost"] == min(r["cost"] for r in keep if r["cost"] is not None)
    assert rec["gpu"] == "a100-80gb"
    # by GPU-hours the same rows would have recommended a faster, dearer GPU: the choice really is by cost
    assert min((r for r in keep if r["cost"] is not None), key=lambda r: r["gpu_hours"])["gpu"] != "a100-80gb"
    cheap = data["cheapest"]
    assert cheap is None or (cheap["cost"] < rec["cost"] and not cheap["keeps"])
    text = " ".join(done.json["messages"])
    assert "Recommended, the cheapest that keeps the question (by cost; prices from" in text
    assert f"{rec['cost']:,.2f} USD" in done.json["summary"]
    assert "cost (with --rates): the row's campaign time in hours × its GPUs × the hourly price" in text


def test_estimate_options_without_rates_says_gpu_hours(tmp_path, cli):
    path = tiny_causal_campaign(tmp_path, _records(24), _records(8, 100))
    done = cli("estimate", path, "--options", "--json")
    assert done.code == 0, done.err
    assert done.json["data"]["by"] == "gpu_hours"
    assert all(r["cost"] is None for r in done.json["data"]["rows"])
    assert "(by GPU-hours; pass --rates FILE for cost)" in " ".join(done.json["messages"])


@pytest.mark.parametrize("text, where, what", [
    ("h100-sxm: 2.0\nv100: 1.0\n", "rates.yaml:2: v100", "no GPU 'v100' in the built-in catalogue"),
    ("h100-sxm: cheap\n", "rates.yaml:1: h100-sxm", "price 'cheap' is not a number >= 0"),
])
@pytest.mark.parametrize("verb", ["estimate", "sheet"])
def test_a_bad_rates_file_is_bad_input_for_the_options_table(tmp_path, cli, text, where, what, verb):
    """`estimate --options` and the sheet without a pilot read the rates before anything is traced."""
    path = tiny_causal_campaign(tmp_path, _records(24), _records(8, 100))
    args = ["--options"] if verb == "estimate" else ["--home", tmp_path / "home"]
    done = cli(verb, path, *args, "--rates", _rates(tmp_path, text))
    assert done.code == 2, done.out + done.err
    assert where in done.err and what in done.err, done.err


def test_rates_without_options_is_a_usage_error(tmp_path, cli):
    path = tiny_causal_campaign(tmp_path, _records(24), _records(8, 100))
    done = cli("estimate", path, "--rates", _rates(tmp_path))
    assert done.code == 2 and "--rates prices the options table: add --options" in done.err


# --- the options section of a piloted sheet ---------------------------------------------------------------
@pytest.fixture(scope="module")
def piloted(tmp_path_factory):
    """A pilot measured on an H100 (CUDA counters), its sheet with rates: training peaks 3 GiB at steady_step,
    the export 5 GiB (reported, not what the options need)."""
    tmp = tmp_path_factory.mktemp("piloted")
    path = campaign(tmp)
    home = tmp / "home"
    run = record_pilot(path, home, {"load": 1.0, "first_step": 2.5, "steady_step": 3.0, "eval_longest": 2.0,
                                    "save": 1.0, "export": 5.0, "reload": 4.0})
    rates = _rates(tmp)
    out = tmp / "sheet.md"
    r = sheet_stage(load_campaign(path), home, gpu="h100-sxm", rates_path=str(rates), out=str(out))
    return {"path": path, "home": home, "run": run, "rates": rates, "result": r, "md": out.read_text()}


def test_piloted_sheet_has_the_options_section_with_what_lora_changes(piloted):
    md = piloted["md"]
    section = md.split("## Options that fit (per GPU and count)")[1].split("\n## ")[0]
    assert "- lora: trains an adapter, not the model: a different experiment" in section
    assert "| LoRA+ckpt " in section and "| changes  |" in section and "| keeps    |" in section
    assert "cost USD" in section and f"the pilot {piloted['run']}'s figures where they exist" in section
    table = piloted["result"].data["options"]
    lora = [x for x in table["rows"] if x["option"] in ("lora", "fsdp_lora", "qlora")]
    assert lora and all(not x["keeps"] and "a different experiment" in x["changes"] for x in lora)
    assert table["recommended"]["keeps"] and table["by"] == "cost"
    assert table["recommended"]["gpu"] == "a100-80gb"  # the cheapest by cost, not the fastest
    assert md.index("## Costs") < md.index("## Options that fit") < md.index("## Launch")


def test_piloted_options_take_the_pilots_memory_and_time_plan(piloted):
    """The campaign as written on the pilot's GPU count is the pilot's own figure: the CUDA counter of the
    highest training phase (steady_step, not the export) and the time plan's seconds; without the pilot the
    estimator would give a few MiB and milliseconds for this tiny model."""
    from pilotrun.sheet import gpu_memory as GM

    data = piloted["result"].data
    table = data["options"]
    anchor = next(x for x in table["rows"] if x["gpu"] == "h100-sxm" and x["option"] == "written"
                  and x["count"] == 1)
    overhead = sum(o["bytes"] for o in GM.overheads(None, 1))
    assert anchor["phase"] == "steady_step" and anchor["peak"] == 3 * GiB
    assert anchor["need"] == GM.need_bytes(3 * GiB, overhead)
    assert anchor["memory_from"].startswith(f"measured: pilot {piloted['run']}")
    tm = data["time"]
    assert math.isclose(anchor["seconds"], tm["per_run_s"] * len(tm["runs"]))
    assert anchor["time_from"].startswith(f"pilot {piloted['run']}")
    others = [x for x in table["rows"] if x["option"] != "written" or x["count"] != 1]
    assert all(x["memory_from"].startswith("predicted") for x in others)
    # host work (load, checkpoints, export, reload) stays as measured on every row of a GPU
    host = sum(t["seconds"] for t in tm["terms"] if t["unit"] in ("run_overhead", "load", "save", "export", "reload"))
    assert all(x["seconds"] >= host * len(tm["runs"]) * 0.999 for x in table["rows"] if x["gpu"] == "h100-sxm")
    assert "_terms" not in tm and "_trace" not in data  # internal, not in the JSON


def test_piloted_options_read_at_80_100_160_columns(piloted):
    from rich.console import Console

    from pilotrun.report.terminal import render_result

    md = piloted["md"]
    assert not [line for line in md.splitlines() if len(line) > 100]
    from pilotrun.sheet.options_view import items as option_items
    from pilotrun.sheet.options_view import listed

    items = [line for line in piloted["result"].messages if line.startswith("  - ") and " per GPU at " in line]
    table = piloted["result"].data["options"]
    assert [x[4:] for x in items] == option_items(table) and len(items) <= len(listed(table)) <= len(table["shown"])
    for width in (80, 100, 160):
        buf = io.StringIO()
        render_result(piloted["result"], Console(file=buf, width=width, color_system=None, force_terminal=False))
        text = buf.getvalue()
        assert max(map(len, text.splitlines())) <= width
        flat = " ".join(text.split())
        assert "== Options that fit (per GPU and count)" in text
        assert "1 × A100 80GB SXM: as written" in flat and "lora: trains an adapter, not the model" in flat


def test_piloted_options_through_a_pipe_and_in_json(piloted, cli):
    done = cli("sheet", piloted["path"], "--home", piloted["home"], "--gpu", "h100-sxm", "--rates",
               piloted["rates"], "--json")
    assert done.code == 0, done.err
    opts = done.json["data"]["options"]
    assert opts["recommended"]["gpu"] == "a100-80gb" and opts["by"] == "cost" and opts["rows"]
    # a pipe is not a terminal: one line per option row, never wrapped
    rows = [line for line in done.err.splitlines() if line.strip().startswith("- 1 × A100 80GB SXM: as written")]
    assert len(rows) == 1 and "USD; keeps the experiment" in rows[0], rows


def test_when_no_priced_gpu_keeps_the_question_the_recommendation_says_so():
    """Rates that price only a GPU where nothing keeps the question: the recommended row is chosen by
    GPU-hours among every GPU (and said so), the cheapest overall by cost among the priced ones."""
    from pilotrun.sheet.options import _choose
    from pilotrun.sheet.options_view import _judged_by

    def row(gpu, keeps, hours, cost):
        return {"gpu": gpu, "fits": True, "keeps": keeps, "gpu_hours": hours, "seconds": hours * 3600, "cost": cost}

    rows = [row("l4", False, 1.0, 0.5), row("h100-sxm", True, 2.0, None), row("a100-80gb", True, 3.0, None)]
    rec, cheap, by = _choose(rows, {"path": "r.yaml", "gpus": {"l4": {"hour": 0.5, "plans": {}}}})
    assert rec["gpu"] == "h100-sxm" and cheap["gpu"] == "l4" and by.startswith("gpu_hours (")
    assert _judged_by({"by": by, "rates": "r.yaml"}) == "by GPU-hours: no GPU priced in r.yaml fits and keeps it"
    # priced rows that keep it: by cost, even where another row has fewer GPU-hours
    rows.append(row("a10", True, 5.0, 0.4))
    rec, cheap, by = _choose(rows, {"path": "r.yaml", "gpus": {}})
    assert (rec["gpu"], cheap["gpu"], by) == ("a10", "a10", "cost")


def test_the_options_list_leaves_out_rows_not_worth_reading_and_says_alike_gpus_once():
    """Issue 43: a campaign that fits one GPU of every kind listed 2, 4 and 8 of each, with LoRA beside them, ~60
    rows a few % apart. Here the other instance — a compute-bound campaign that needs 2 of a small GPU: more GPUs
    are listed where fewer do not fit or they are at least a quarter faster, LoRA where as written does not fit
    or it is a quarter faster; GPUs whose rows read the same are said in one line; the JSON keeps every row."""
    from pilotrun.sheet.options_view import blocks, items, listed

    def row(gpu, count, seconds, keeps=True):
        return {"option": "written" if keeps else "lora", "gpu": gpu, "name": gpu.upper(), "count": count,
                "seconds": seconds, "fits": True, "peak": 3 * GiB, "phase": "steady_step", "short": "w",
                "label": "as written" if keeps else "LoRA r=16", "keeps": keeps, "cost": None,
                "changes": "keeps the experiment" if keeps else "trains an adapter", "gpu_hours": seconds * count / 3600}

    shown = [row("l4", 2, 1000.0), row("l4", 1, 900.0, keeps=False),   # as written needs 2: LoRA on 1 is listed
             row("l4", 4, 520.0), row("l4", 8, 480.0),                   # 4 halves the time: listed; 8 does not
             row("a100", 1, 400.0), row("a100", 1, 350.0, keeps=False),  # LoRA 12 % faster: not worth a change
             row("h100", 1, 400.0), row("h100", 2, 390.0)]               # as the A100's: one line; 2 barely faster
    table = {"recommended": shown[0], "cheapest": None, "pilot_run": None, "params": 10, "by": "gpu_hours",
             "currency": "", "shown": shown, "meanings": {}, "assumptions": [], "skipped": None, "rows": shown}
    assert [(x["gpu"], x["count"], x["keeps"]) for x in listed(table)] == [
        ("l4", 2, True), ("l4", 1, False), ("l4", 4, True), ("a100", 1, True), ("h100", 1, True)]
    said = items(table)
    assert said[-1].startswith("1 × A100 or H100: as written — 3.00 GiB per GPU at steady_step, 6.7 min"), said
    assert len(said) == 4 and said[1].startswith("1 × L4: LoRA r=16"), said
    text = " ".join(str(b[-1]) for b in blocks(table))
    assert "3 row(s) not listed: more GPUs of a kind less than a quarter faster than fewer" in text, text
