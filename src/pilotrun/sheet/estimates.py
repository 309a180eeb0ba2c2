"""What the sheet asks the estimator (probe/trace.py) for a pilot: the GPU memory a CPU pilot's phases
would take on CUDA, the largest sizes that fit the target GPU, and the options table; each kept in the journal's
home (``campaign/reuse.kept_result``) and read back by the next sheet of the same campaign, files, pilotrun and
inputs, which then neither reads the data nor imports torch."""

from __future__ import annotations

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.prepare import prepare
from pilotrun.campaign.reuse import kept_result
from pilotrun.probe.alloc_conf import DEFAULTS, Settings
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import CATALOGUE
from pilotrun.probe.alloc_conf import parse_settings
from pilotrun.probe.trace import rows_for
from pilotrun.sheet.gpu_memory import capacity, fit_table, on_cards, phase_needs, workspace_bytes
from pilotrun.sheet.options import TRAINING, options_table
from pilotrun.signals import unless_stopping


class _Prepared:
    """The encoded data (``campaign/prepare.prepare``), read on first use: a sheet whose estimator results are
    all kept in the journal's home (``campaign/reuse``) never reads or encodes the data, nor imports torch.
    Calling it returns the prepared data or raises what stopped it (kept in ``error``)."""

    def __init__(self, loaded):
        self.loaded, self.prep, self.error = loaded, None, None

    def __call__(self):
        if self.prep is None and self.error is None:
            try:
                self.prep = prepare(self.loaded, splits=("train", "validation"), shapes=True)
            except Exception as e:  # noqa: BLE001 - each caller names it in its own words
                unless_stopping(e)
                self.error = e
        if self.error is not None:
            raise self.error
        return self.prep


def prediction(loaded, rows: list[dict], sheet: dict, settings: Settings = DEFAULTS):
    """The encoded data, prepared when first used (for the size caps and probes), and the estimate's per-phase
    rows for CUDA replayed under the launch's allocator ``settings``, with each catalogue card's replay
    (``sheet["_cards"]``), kept in the home; (prepared, None) with a problem named when they cannot be had. A pilot
    with CUDA counters keeps its own figures: the prediction is then beside them (the fragmentation each shows)."""
    from pilotrun.sheet.gpu_memory import predict_rows  # lazy: looked up when called: tests replace it

    prep = sheet["_prep"] = _Prepared(loaded)
    t = loaded.campaign.train
    ranks = data_parallel_ranks(t)

    def predicted():
        out, sheet["_trace"] = predict_rows(loaded, prep(), settings)
        cards = on_cards(sheet["_trace"], out, CATALOGUE, ranks=ranks, strategy=t.strategy, settings=settings)
        return {"rows": out, "cards": cards}

    try:
        kept = kept_result(loaded, {"predicted_rows": "cuda", "allocator": settings.text}, predicted)
    except Exception as e:  # noqa: BLE001 - a campaign fake tensors cannot build is named, not fatal
        unless_stopping(e)
        if rows[0].get("counter") != "cuda":
            sheet["problems"].append(
                f"no GPU memory figure: the pilot ran on CPU (its RSS is not GPU memory) and `pilotrun estimate` "
                f"could not predict it ({type(e).__name__}: {e}); pilot on one GPU, or fix what stops the estimate")
        return prep, None
    sheet["_cards"] = kept["cards"]
    return prep, kept["rows"]


def _largest_asked(prep, rows, target, ranks, t, c, settings: Settings) -> dict | None:
    """What the largest sizes' bisection is asked (its kept result's key), or None where the data could not be
    prepared (the measured growth then answers)."""
    if prep is None or prep.error is not None:
        return None
    peaks = P.phase_peaks(rows)
    su = (peaks.get("steady_step") or {}).get("inputs", {})
    ev = (peaks.get("eval_longest") or {}).get("inputs", {})
    return {"limit": capacity(target, ranks), "total": target.memory_bytes, "workspace": workspace_bytes(target),
            "allocator": settings.text, "micro_batch": t.micro_batch, "eval_batch": t.eval_batch,
            "seq_len": su.get("seq_len") or c.data.max_length, "eval_seq_len": ev.get("seq_len") or c.data.max_length}


def _largest_sizes(loaded, prep, asked: dict, settings: Settings) -> dict:
    from pilotrun.sheet.sizes import Prober, largest_sizes  # lazy: looked up when called: tests replace them

    return largest_sizes(loaded, prep(), asked["limit"], micro_batch=asked["micro_batch"],
                         eval_batch=asked["eval_batch"], seq_len=asked["seq_len"], eval_seq_len=asked["eval_seq_len"],
                         total=asked["total"], prober=Prober(loaded, prep(), settings=settings,
                                                             workspace=asked["workspace"]))


def largest_ahead(loaded, prep, rows, target, ranks, t, c, settings: Settings = DEFAULTS):
    """The largest sizes' bisection started in a forked worker (probe/workers.py), so that this process traces the
    options table meanwhile (each is one core's work of fake tensors, ~1.7 and ~2.3 s on MiniLM): the worker, or
    None where it is kept in the home, the data cannot be prepared or the machine does not allow one (``largest``
    then computes it here, as always). The worker's value is the one computed here would be: the same campaign,
    prepared data and question, at the fork."""
    from pilotrun.campaign.reuse import has_result
    from pilotrun.probe import workers

    asked = _largest_asked(prep, rows, target, ranks, t, c, settings)
    if asked is None or has_result(loaded, {"largest_sizes": asked}):
        return None
    try:
        prep()  # here, before the fork: this process's options table uses the same prepared data
    except Exception as e:  # noqa: BLE001 - ``largest`` meets it again and falls back, saying why
        unless_stopping(e)
        return None
    return workers.start(lambda: _largest_sizes(loaded, prep, asked, settings))


def largest(loaded, prep, rows, target, kind, ranks, t, c, settings: Settings = DEFAULTS, ahead=None) -> dict:
    """The largest sizes on ``target`` (sheet/sizes.py's definition): the estimator's probes replayed on the
    target's capacity, else the measured growth, else why not. ``ahead``: the worker ``largest_ahead`` started for
    them (its value taken when it answers whole, else computed here)."""
    import time

    asked = _largest_asked(prep, rows, target, ranks, t, c, settings)
    if asked is not None:
        def compute():
            # the worker's share is about what this process did meanwhile: a generous bound before it is killed
            value = ahead.result(timeout=60 + 4 * (time.monotonic() - ahead.started)) if ahead is not None else None
            return value if value is not None else _largest_sizes(loaded, prep, asked, settings)

        try:
            return kept_result(loaded, {"largest_sizes": asked}, compute)
        except Exception as e:  # noqa: BLE001 - fall back to the measured growth, saying why
            unless_stopping(e)
            why = "the data could not be prepared" if prep.error is e else f"{type(e).__name__}: {e}"
    else:
        why = "the data could not be prepared"
    peaks, limit = P.phase_peaks(rows), capacity(target, ranks)
    out = {}
    for name, phase, key in (("micro_batch", "steady_step", "micro_batch"), ("eval_batch", "eval_longest",
                                                                            "eval_batch"),
                             ("seq_len", "steady_step", "seq_len")):
        r = peaks.get(phase)
        out[name] = P.largest_by_growth(r, limit, key) if r else {"value": None, "source": f"no {phase} row"}
        out[name]["fallback"] = f"the estimator could not run ({why})"
    return out


def options(sheet, loaded, prep, rates, gpu_rows, kind, ranks) -> None:
    """The options table, the campaign as written taking the pilot's memory (CUDA) and time plan."""
    import time

    needs = {}
    for g in CATALOGUE:
        card = (sheet.get("_cards") or {}).get(g.key) if kind == "predicted" else None
        train = [p for p in phase_needs(gpu_rows, kind, g, ranks, card=card)
                 if p["phase"] in TRAINING and p["need"] is not None]
        if train:
            needs[g.key] = max(train, key=lambda p: p["need"])
    tm = sheet.get("time") or {}
    pilot = {"run": sheet["pilot_run"], "ranks": ranks, "runs": len(tm.get("runs") or []) or 1, "kind": kind,
             "needs": needs, "terms": tm.get("_terms") or {}}
    started = time.perf_counter()
    try:  # kept in the home: the same campaign, files, pilotrun, pilot figures and rates give the same table
        sheet["options"] = kept_result(loaded, {"options_table": {"rates": rates, "pilot": pilot}}, lambda: options_table(
            loaded, prep=prep(), rates=rates, written=sheet.get("_trace"), pilot=pilot))
        sheet["options"]["wall_s"] = time.perf_counter() - started  # this sheet's, a kept table's read included
    except Exception as e:  # noqa: BLE001 - the sheet stands without its options table; say why
        unless_stopping(e)
        sheet["options"] = None
        sheet["warnings"].append(f"no options table: the estimator could not run ({type(e).__name__}: {e})")


EXPANDABLE = "expandable_segments:True"


def expandable_advice(sheet, loaded, fits, gpu_rows, ranks, t, bf16: bool, gpus=CATALOGUE) -> None:
    """The catalogue cards that do not fit as the campaign is launched but fit with ``expandable_segments:True``
    (the same trace replayed with it, kept in the home): ``sheet["advice"]``, each with both figures; the launch
    files set the variable when the sheet's target is one of them (``sheet["launch_env"]``)."""
    from pilotrun.sheet.gpu_memory import predict_rows  # lazy: looked up when called: tests replace it

    short = [f for f in fits if not f["fits"] and not f["verdict"].startswith("does not fit: no bf16")]
    if not short or sheet.get("_trace") is None and not sheet.get("_cards"):
        return
    settings = parse_settings(EXPANDABLE)

    def predicted():
        tr = sheet.get("_trace")
        if tr is None:
            _, tr = predict_rows(loaded, sheet["_prep"](), settings)
        rows = rows_for(tr, ranks=ranks, strategy=t.strategy, settings=settings)
        return {"rows": rows, "cards": on_cards(tr, rows, [g for g in gpus if g.key in {f["gpu"] for f in short}],
                                                 ranks=ranks, strategy=t.strategy, settings=settings)}

    try:
        kept = kept_result(loaded, {"predicted_rows": "cuda", "allocator": EXPANDABLE, "cards": [f["gpu"] for f in short]},
                           predicted)
    except Exception as e:  # noqa: BLE001 - the sheet stands without the advice; say why
        sheet["warnings"].append(f"no allocator advice: the replay could not run ({type(e).__name__}: {e})")
        return
    by_key = {g.key: g for g in gpus}
    again = fit_table(kept["rows"], "predicted", [by_key[f["gpu"]] for f in short], needs_bf16=bf16, ranks=ranks,
                      cards=kept["cards"])
    advice = []
    for before, after in zip(short, again):
        if after["fits"]:
            advice.append({"gpu": before["gpu"], "name": before["name"], "setting": EXPANDABLE,
                           "variable": "PYTORCH_CUDA_ALLOC_CONF", "default_reserved": before["reserved"],
                           "default_need": before["need"], "reserved": after["reserved"], "need": after["need"],
                           "memory_bytes": before["memory_bytes"]})
    sheet["advice"] = advice
