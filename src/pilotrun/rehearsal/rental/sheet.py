"""sheet: the selection sheet and rental time plan, from the pilot's ledger rows in the journal.

The pilot is found by what it measured, whatever the campaign's name (``journal.runs.find_pilot``);
the sheet itself is built below the stages (``sheet.build.build_sheet``). No pilot is a
failing verdict (exit 1), not a bad input: the campaign is fine, a stage it depends on has not run,
and inside ``all`` a failing verdict lets the summary table still print where BadInput would stop it.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.campaign.importers import not_reproduced_lines
from pilotrun.errors import DiskFull, from_os_error
from pilotrun.journal.files import output_kind, refuse_replacing, write_output
from pilotrun.journal.runs import find_pilot
from pilotrun.journal.store import Journal
from pilotrun.sheet import plan as P
from pilotrun.sheet.build import build_sheet
from pilotrun.sheet.catalogue import BY_KEY, get_gpu
from pilotrun.sheet.launch import launch_plan, options_launch, refuse_launch_over, write_launch
from pilotrun.sheet.options_view import TITLE, no_pilot_blocks, no_pilot_sheet, too_large_here
from pilotrun.sheet.rates import read_rates
from pilotrun.sheet.render import to_lines, to_markdown
from pilotrun.sheet.ship import wheel_beside
from pilotrun.sheet.sections import size
from pilotrun.sheet.stack import read_target_env
from pilotrun.signals import unless_stopping
from pilotrun.verdicts import StageResult, worst


PREFACE = "## Not reproduced by the rehearsal"  # an imported campaign's sheet begins with it, then the sheet's title


def _a_sheet(first: bytes) -> bool:
    """Whether a file beginning with ``first`` is a sheet pilotrun wrote (with or without the preface)."""
    title = f"# {TITLE}".encode()
    return first.startswith(title) or first.startswith(PREFACE.encode()) and b"\n" + title in first


def refuse_sheet_over(out: str | Path, loaded, beside: bool = True, fix: str | None = None) -> None:
    """Exit 2 where the sheet at ``out`` or a launch file beside it (``beside``: ``out`` is a file in a folder) would
    replace a file of the user's: the campaign itself, a data file, their own train.sbatch (``refuse_replacing``)."""
    refuse_replacing(out, "--out", _a_sheet, "selection sheet", fix)
    if beside and loaded.source is not None:
        refuse_launch_over(Path(out), fix)


def sheet_stage(loaded, home, *, target_env_path: str | None = None, gpu: str | None = None,
                out: str | None = None, rates_path: str | None = None, sets: tuple[str, ...] = (),
                options: bool = True, say_imported: bool = True) -> StageResult:
    """The sheet; for an imported campaign it says once which of the source's settings the rehearsal does not
    reproduce (``say_imported``: `all` says it itself)."""
    lines = not_reproduced_lines(loaded.campaign) if say_imported else []
    preface = "\n".join([PREFACE, "", lines[0], ""] +
                         [f"- {x.strip()}" for x in lines[1:]]) + "\n\n" if lines else ""
    result = _sheet_stage(loaded, home, target_env_path=target_env_path, gpu=gpu, out=out, rates_path=rates_path,
                          sets=sets, options=options, preface=preface)
    if lines:
        result.messages[:0] = lines
        result.data["not_reproduced"] = lines
    return result


def _sheet_stage(loaded, home, *, target_env_path: str | None = None, gpu: str | None = None,
                 out: str | None = None, rates_path: str | None = None, sets: tuple[str, ...] = (),
                 options: bool = True, preface: str = "") -> StageResult:
    """``preface``: Markdown put before the sheet's own (the settings not reproduced). The launch files and the
    wheel go beside ``out`` when it is a file; a device or a pipe (``--out /dev/stdout``) gets the Markdown only."""
    beside = bool(out) and output_kind(out) == "file"
    if out:
        refuse_sheet_over(out, loaded, beside)
    target_env = read_target_env(target_env_path) if target_env_path else None
    if gpu:
        get_gpu(gpu)  # a bad --gpu is a bad input before anything else
    rates = None
    if rates_path:
        rates = read_rates(rates_path)
    journal = Journal(home)
    c = loaded.campaign
    pilot, stale = find_pilot(journal, c.name, loaded.config_sha256(), loaded.resolved_dict())
    if pilot is None:
        too_large = too_large_here(loaded)  # the estimator knows the model's size before anything is loaded
        if too_large is not None:
            result = no_pilot_sheet(loaded, too_large, rates=rates)
            if beside and loaded.source is not None:
                result.data["launch"] = options_launch(result.data, loaded, sets, str(journal.home))
            result.data["markdown"] = preface + to_markdown({"blocks": no_pilot_blocks(result.data)})
            if out:
                write_output(out, result.data["markdown"], "--out")
                written = [Path(out)]
                if (result.data.get("launch") or {}).get("files"):
                    written += write_launch(result.data, loaded, Path(out), result.data["launch"]["files"])
                result.data["written"] = [str(p) for p in written]
                result.messages.append(_written(out, written, beside))
            return result
        return StageResult("sheet", "fail", f"no pilot run for campaign {c.name!r} in {journal.path}",
                           [f"the sheet is built from the pilot's measurements; run `pilotrun pilot "
                            f"{loaded.source or 'CAMPAIGN'}` first (with the same --home)"], {"pilot_run": None})
    # pilotrun's wheel for the launch files, when it ships as one, is built on the other core during the traces
    with wheel_beside(Path(out).resolve().parent if beside and loaded.source is not None else None):
        sheet = build_sheet(loaded.resolved_dict() if not stale else pilot["config"], journal, pilot,
                            target_env=target_env, gpu=gpu, rates=rates, options=options)
        sheet["home"] = str(journal.home)
        if stale:
            sheet["warnings"].insert(0, stale)
        written = []
        if out:
            written = _write(sheet, loaded, Path(out), sets, preface, beside)
    verdict = worst(["fail" if sheet["problems"] else "warn" if sheet["warnings"] else "ok"])
    need = sheet["memory"]
    tgt = sheet.get("target")
    summary = (f"needs {size(need['need'])} per GPU (peak at {need['phase']}, {need['kind']})"
               if need["need"] else "no GPU memory figure") + (f"; target {tgt['name']}" if tgt else "; no GPU fits")
    if sheet.get("time"):
        summary += f"; campaign {P.fmt_duration(sheet['time']['campaign_s'])}"
    if (sheet.get("costs") or {}).get("cheapest"):
        ch = sheet["costs"]["cheapest"]
        summary += f"; cheapest {ch['plan']} plan {ch['gpu']} {ch['cost']:,.2f} {sheet['costs']['currency']}".rstrip()
    fit_cols = ["gpu", "memory", "need", "verdict", "campaign time"]
    fit_rows = [{"gpu": f["name"], "memory": f"{f['memory_bytes'] / 2**30:g} GiB",
                 "need": size(f["need"]),
                 "verdict": f["verdict"], "campaign time": P.fmt_duration(f.get("campaign_s"))} for f in sheet["fit"]]
    sheet["markdown"] = preface + to_markdown(sheet)
    lines = to_lines(sheet) + ([_written(out, written, beside)] if out else [])
    return StageResult("sheet", verdict, summary, lines, sheet, fit_cols, fit_rows)


def _written(out: str, written: list[Path], beside: bool) -> str:
    if beside:
        return f"written to {Path(out).parent}: " + ", ".join(p.name for p in written)
    return (f"written to {out}; no launch files: it is not a file in a folder (a device or a pipe), so name a file "
            "to get them beside it")


def _write(sheet, loaded, out: Path, sets, preface: str, beside: bool) -> list[Path]:
    """sheet.md and, for the chosen GPU and plan, the launch files next to it (``beside``: ``out`` is a file)."""
    files = []
    ch = sheet.get("launch") if beside else None  # a device or a pipe has no folder for the launch files
    if ch and loaded.source is not None:
        try:
            sheet["launch"]["files"] = launch_plan(sheet, loaded, BY_KEY[ch["gpu"]], ch["plan"], sets)
        except Exception as e:  # noqa: BLE001 - the sheet stands without its launch files; say why
            unless_stopping(e)
            refused = e if isinstance(e, DiskFull) else from_os_error(e, out.parent)
            if refused is not None:  # a full disk, a read-only --out: exit 2 naming it, not a sheet without files
                raise refused from None
            sheet["warnings"].append(f"no launch files: {type(e).__name__}: {e}")
    elif beside and not ch:
        sheet["warnings"].append("no launch files: no GPU and plan to launch (see the problems above)")
    write_output(out, preface + to_markdown(sheet), "--out")
    files.append(out)
    if beside and (sheet.get("launch") or {}).get("files"):
        files += write_launch(sheet, loaded, out, sheet["launch"]["files"])
    sheet["written"] = [str(p) for p in files]
    return files
