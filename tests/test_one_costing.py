"""One costing rule (sheet/rates.rent) prices the sheet's headline, its Costs section and every row of the options
table: a short campaign is priced by the hour, never by a 3-day plan it does not need, and a whole-day plan
counts only where its days less hardware.reserve hold the campaign."""

from __future__ import annotations

import math

from test_sheet import campaign, long_campaign, record_pilot

from pilotrun.campaign.load import load_campaign
from pilotrun.rehearsal.rental.sheet import sheet_stage
from pilotrun.sheet.rates import rent

DAY = 86400


def test_the_rule_hourly_or_a_whole_day_plan_that_holds_the_campaign_less_the_reserve():
    rate = {"hour": 1.0, "plans": {3: 40.0, 7: 100.0}}
    # 48.9 s by the hour is a cent; the 3-day plan is never the price of a campaign shorter than a day
    cost, how, days = rent(rate, 48.9, 1, 0.2)
    assert days is None and math.isclose(cost, 48.9 / 3600) and how == "0.0136 h (campaign time) × 1 GPU(s) × 1/h"
    # 40 h by the hour is 40; the 3-day plan (57.6 h after a 20% reserve) holds it at 40 too: a tie is hourly
    assert rent(rate, 40 * 3600, 1, 0.2)[2] is None
    # 50 h: 50 by the hour, 40 on the 3-day plan, which holds up to 3 × 24 × 0.8 = 57.6 h exactly
    assert rent(rate, 50 * 3600, 2, 0.2) == (80.0, "3-day plan 40 × 2 GPU(s) (campaign time 50 h)", 3)
    assert rent(rate, 3 * DAY * 0.8, 1, 0.2)[2] == 3
    # one second over: the 3-day plan no longer holds it; 57.6 h by the hour (57.6) beats the 7-day plan (100)
    cost, how, days = rent(rate, 3 * DAY * 0.8 + 1, 1, 0.2)
    assert days is None and math.isclose(cost, (3 * DAY * 0.8 + 1) / 3600)
    # 120 h: the 7-day plan (100) beats 120 by the hour; without a reserve the 3-day plan would not hold it either
    assert rent(rate, 120 * 3600, 1, 0.0)[2] == 7
    # no hourly price: only a plan that holds it, else None and why
    assert rent({"hour": None, "plans": {7: 50.0}}, 6 * DAY, 1, 0.2) == (None, "no hourly price and no plan of "
                                                                          "7.5 days or more", None)
    assert rent({"hour": None, "plans": {7: 50.0}}, 5 * DAY, 3, 0.2, "l4")[:2] == (150.0, "7-day plan 50 × 3 GPU(s) "
                                                                                          "(campaign time 120 h)")
    assert "for l4" in rent({"hour": None, "plans": {}}, 60, 1, 0.2, "l4")[1]


def _headline_and_row(tmp_path, path, gpu, rates_text, **kw):
    home = tmp_path / "home"
    record_pilot(path, home, {"load": 1.0, "first_step": 2.5, "steady_step": 3.0, "eval_longest": 2.0}, **kw)
    rates = tmp_path / "rates.yaml"
    rates.write_text(rates_text)
    r = sheet_stage(load_campaign(path), home, gpu=gpu, rates_path=str(rates))
    ch = r.data["costs"]["cheapest"]
    row = next(x for x in r.data["options"]["rows"] if x["gpu"] == gpu and x["option"] == "written" and x["count"] == 1)
    return r, ch, row


def test_a_short_campaigns_headline_is_its_hourly_price_as_its_row_says(tmp_path):
    """The issue's sheet: `cheapest 3-day plan rtx4090 49.68 USD` over `as written on 1 × RTX 4090 … 0.01 USD`."""
    path = campaign(tmp_path, hardware__memory_per_gpu="24GiB")
    r, ch, row = _headline_and_row(tmp_path, path, "rtx4090", "currency: USD\nrtx4090:\n  hour: 0.69\n  3: 49.68\n",
                                   steady_s=0.05)
    assert r.data["time"]["total_s"] < DAY
    assert ch["gpu"] == "rtx4090" and ch["plan"] == "hourly" and ch["days"] is None
    assert math.isclose(ch["cost"], row["cost"]) and ch["how"] == row["cost_how"] and ch["cost"] < 1.0
    assert f"cheapest hourly plan rtx4090 {ch['cost']:,.2f} USD" in r.summary and "3-day plan" not in r.summary
    md = r.data["markdown"]
    assert f"Cheapest plan that places every run: rtx4090, the hourly plan, {ch['cost']:,.2f} USD" in md
    assert "| hourly " in md.split("## Costs")[1].split("\n## ")[0]


def test_a_multi_day_campaigns_headline_is_the_tier_its_row_takes_and_the_reserve_counts(tmp_path):
    """66.7 h on an H100: the 3-day plan (100) is cheapest on paper but holds 57.6 h after the 20% reserve, so
    neither the headline nor the row takes it; the 7-day plan (120) beats 133.39 by the hour in both."""
    path = long_campaign(tmp_path)
    r, ch, row = _headline_and_row(tmp_path, path, "h100-sxm",
                                   "currency: USD\nh100-sxm:\n  hour: 2.0\n  3: 100.0\n  7: 120.0\n",
                                   params=7_000_000_000)
    assert 57.6 * 3600 < r.data["time"]["total_s"] < 7 * DAY * 0.8
    assert (ch["plan"], ch["days"], ch["cost"]) == ("7-day", 7, 120.0)
    assert (row["cost"], row["cost_how"]) == (ch["cost"], ch["how"])
    assert "cheapest 7-day plan h100-sxm 120.00 USD" in r.summary
    rows = {(x["gpu"], x["days"]): x for x in r.data["costs"]["rows"]}
    assert not rows[("h100-sxm", 3)]["fits_all"] and rows[("h100-sxm", 7)]["fits_all"]
    assert r.data["launch"]["days"] == 7
