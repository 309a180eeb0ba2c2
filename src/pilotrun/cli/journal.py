"""The journal verbs: runs, show, note, export."""

from __future__ import annotations

import click

from pilotrun.cli.common import common_options, emit_data, home_for, load
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


def _journal(home):
    from pilotrun.journal.store import Journal

    return Journal(home_for(home), create=False)


@cli.command()
@click.option("--kind", default=None, help="only runs of this kind (train, pilot, overfit, sweep ...)")
@common_options
def runs(kind, home, as_json):
    """Every run in the journal, newest first (as the report lists them), with its status."""
    from pilotrun.journal.runs import run_table_rows
    from pilotrun.report.terminal import render_runs

    j = _journal(home)
    data = run_table_rows(j, j.list_runs(kind=kind))[::-1]  # newest first, the one order of runs and the report
    summary = f"{len(data)} runs" + (f" of kind {kind}" if kind else "") + ", newest first"
    kinds = sorted({r["kind"] for r in j.list_runs()}) if kind and not data else []
    if kinds:  # a kind the journal never held (a typo: --kind pilto) said as such, not as an empty journal
        summary = f"no run of kind {kind!r} in this journal; its kinds: {', '.join(kinds)}"
    return emit_data({"runs": data}, as_json, lambda con, d: con.print(summary, markup=False) if kinds else
                     render_runs(con, d["runs"]), summary=summary, verdict="warn" if kinds else "ok")


@cli.command()
@click.argument("run_id")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="also write the run's metrics as TensorBoard event files under DIR/RUN_ID")
@common_options
def show(run_id, home, as_json, tensorboard_dir=None):
    """One run: config, status, metrics, phase rows, notes and files."""
    from pilotrun.report.terminal import render_run, train_loss_summary

    from pilotrun.journal.runs import run_table_rows

    j = _journal(home)
    run, = run_table_rows(j, [j.require_run(run_id)])
    run_id = run["run_id"]
    if tensorboard_dir is not None:
        from pilotrun.report.tensorboard import export_tensorboard

        exported = export_tensorboard(j, run_id, tensorboard_dir)
        click.echo(f"TensorBoard: {exported['scalars']} scalars in {exported['dir']}", err=True)
    run_dir = j.run_dir(run_id)
    if not run_dir.is_dir():  # the journal still shows the run; say that its files are gone and how to restore them
        from pilotrun.journal.runs import missing_run_folder

        gone = missing_run_folder(j, run_id)
        click.echo(f"pilotrun: warning: {gone.detail}\n  fix: {gone.fix}", err=True)
    train_loss = j.metrics(run_id, "train", "loss")
    data = {"run": run, "phases": j.phase_rows(run_id), "notes": j.notes(run_id),
            "validation": j.metrics(run_id, "validation"),
            "train_updates": len(train_loss), "train_loss": train_loss_summary(train_loss),
            "files": sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
            if run_dir.is_dir() else [], "run_folder": {"path": str(run_dir), "exists": run_dir.is_dir()}}
    return emit_data(data, as_json, render_run, summary=f"run {run_id} ({run['kind']}): {run['shown_status']}")


@cli.command()
@click.argument("text")
@click.option("--run", "run_id", default=None, help="the run the note is about")
@click.option("--decision", is_flag=True, help="record the note as a decision")
@common_options
def note(text, run_id, decision, home, as_json):
    """Add a note (or a decision) to the journal."""
    from pilotrun.journal.store import Journal

    j = Journal(home_for(home))
    if run_id is not None:
        run_id = j.resolve_run_id(run_id, where="--run")
    note_id = j.add_note(text, run_id=run_id, decision=decision)
    data = {"note_id": note_id, "run_id": run_id, "decision": decision, "text": text}
    said = f"{'decision' if decision else 'note'} {note_id} recorded" + (f" for run {run_id}" if run_id else "")
    return emit_data(data, as_json, lambda con, d: con.print(said, markup=False), summary=said)


@cli.command()
@click.argument("what", required=False, metavar="[RUN_ID | SWEEP_ID | CAMPAIGN]")
@click.option("--to", "to", type=click.Choice(["mlflow", "wandb"]), default=None,
              help="the tracker (default: the campaign's track.to)")
@click.option("--uri", default=None, help="MLflow's tracking URI (default: the campaign's track.uri, else "
                                          "$MLFLOW_TRACKING_URI, else sqlite:///HOME/mlflow.db)")
@click.option("--experiment", default=None, help="the MLflow experiment or W&B project (default: the campaign's "
                                                 "track.experiment, else its name)")
@common_options
def export(what, to, uri, experiment, home, as_json):
    """Send the journal's runs (one run, a sweep, a campaign file's runs, or with nothing named every run) to
    MLflow or Weights & Biases: config, metrics, verdicts, ledger, sheet, report. Idempotent."""
    from pathlib import Path

    from pilotrun.cli.common import emit
    from pilotrun.errors import BadInput
    from pilotrun.integrations.trackers.export import export as run_export

    campaign_name, track = None, None
    if what is not None and Path(what).is_file():  # a campaign file: its runs, its track key, its home
        loaded = load(what)
        campaign_name, track = loaded.campaign.name, loaded.campaign.track
        home = home_for(home, what)
    else:
        home = home_for(home)
    to = to or (track.to if track else None)
    if to is None:
        raise BadInput("no tracker named", where="--to", fix="pass --to mlflow or --to wandb (or set the campaign's "
                                                              "track: {to: mlflow})")
    same = track is not None and track.to == to
    from pilotrun.journal.store import Journal

    journal = Journal(home, create=False)
    with stage_progress("export"):  # a server takes a second or more a run: a journal of hundreds is minutes
        result = run_export(journal, to, what if campaign_name is None else None, campaign_name=campaign_name,
                            uri=uri or (track.uri if same else None),
                            experiment=experiment or (track.experiment if same else None))
    return emit(result, as_json)


@cli.command(name="_mirror-home", hidden=True)
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--restore", is_flag=True, help="copy only what DEST lacks; the journal only when DEST has none")
@click.option("--journal/--no-journal", default=True, help="copy the journal's snapshot too (rank 0's node)")
def mirror_home(src, dest, restore, journal):
    """Internal: the launch files' copy of a home on the instance's disk to the bucket mount and back
    (journal/mirror.py says why the journal does not live on the bucket)."""
    from pilotrun.journal.mirror import mirror

    done = mirror(src, dest, journal=journal, restore=restore)
    click.echo(f"{src} → {dest}: {len(done['files'])} files" + (", the journal" if done["journal"] else ""))
