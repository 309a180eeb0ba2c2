"""``import_config``: read the source, tell its format, map it, validate the campaign, write it atomically."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from pilotrun.campaign.importers import foreign, schemas
from pilotrun.campaign.importers.axolotl import import_axolotl
from pilotrun.campaign.importers.builder import Builder, Imported
from pilotrun.campaign.importers.hf import import_hf
from pilotrun.campaign.importers.render import render, short
from pilotrun.campaign.importers.source import FORMATS, detect, read_source
from pilotrun.campaign.load import campaign_errors
from pilotrun.campaign.schema import Campaign
from pilotrun.errors import BadInput, BadInputs
from pilotrun.journal.files import atomic_write_text, refuse_stream
from pilotrun.signals import unless_stopping

def import_config(source: str | Path, fmt: str | None = None, out: str | Path | None = None,
                  force: bool = False) -> Imported:
    """Read ``source``, map it to a campaign and write it to ``out`` (default: campaign.yaml beside the source).
    Nothing is written when anything is bad input (exit 2)."""
    source = Path(source).expanduser().resolve()
    if fmt is not None and fmt not in FORMATS:
        raise BadInput(f"--from {fmt}: unknown format", where="--from", fix="use --from axolotl or --from hf")
    raw = read_source(source)
    foreign.refuse(raw, source)  # LLaMA-Factory, torchtune, accelerate, DeepSpeed: what to do instead
    detected = fmt is None
    fmt = fmt or detect(raw, source)
    out_path = Path(out).expanduser() if out else source.parent / "campaign.yaml"
    refuse_stream(out_path, "--out", "the campaign's paths are written relative to its folder, and every verb "
                                     "reads it back from there")
    out_path = out_path.resolve()
    if out_path == source:
        raise BadInput("--out names the source config itself", where="--out", fix="write the campaign to another file")
    if out_path.exists() and not force:
        raise BadInput(f"{out_path} exists; the import does not overwrite it", where="--out",
                       fix="pass another --out, or --force to replace it")
    b = Builder(fmt, source, out_path)
    (import_axolotl if fmt == "axolotl" else import_hf)(raw, b)
    if b.problems:
        raise BadInputs(b.problems) if len(b.problems) > 1 else b.problems[0]
    campaign = b.c
    campaign["imported"] = {"tool": fmt, "file": str(source),
                            "not_carried": [{"key": n.key, "value": short(n.value), "effect": n.reason,
                                             **({"until": n.until} if n.until else {})} for n in b.not_carried]}
    for section in ("model", "data", "train"):
        if not campaign[section]:
            campaign[section] = {}
    for key in ("model.path", "data.train", "data.validation"):
        sec, k = key.split(".")
        campaign[sec].setdefault(k, None)
    try:
        Campaign.model_validate(campaign)
    except ValidationError as e:  # a value the campaign refuses (a negative lr ...): named by its source key
        blamed = {tuple(c.key.split(".")): f"{source}: {c.source} (imported as {c.key})" for c in b.carried}
        raise campaign_errors(e, str(source), {}, blamed) from None
    except Exception as e:
        unless_stopping(e)
        raise BadInput(f"the imported values do not make a valid campaign: {e}", where=str(source),
                       fix="correct the value in the source config") from None
    imp = Imported(fmt, detected, source, out_path, campaign, b.carried, b.not_carried, b.to_set,
                   schemas=schemas.sources(("axolotl",) if fmt == "axolotl" else ("transformers", "trl")))
    imp.text = render(imp)
    atomic_write_text(out_path, imp.text)
    return imp
