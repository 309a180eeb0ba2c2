"""env and sheet: the software stack of this machine, and the selection sheet with the rental plan."""

from __future__ import annotations

import click

from pilotrun.cli.common import campaign_argument, common_options, console, emit, home_for, load, set_option
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
from pilotrun.sheet.catalogue import BY_KEY
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


@cli.command()
@common_options(home=False)
def env(home, as_json):
    """Software stack: Python, torch, CUDA/cuDNN/NCCL, devices, bf16, attention kernels, key packages."""
    from pilotrun.rehearsal.rental.env import env_markdown, env_stage

    result = env_stage()
    console(as_json).print(env_markdown(result.data), markup=False, highlight=False, end="")
    return emit(result, as_json, rendered=True)


@cli.command()
@campaign_argument
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="write the sheet as Markdown here, and the launch files next to it "
                   "(STEM.commands.sh, STEM.sky.yaml, STEM.sbatch)")
@click.option("--target-env", type=click.Path(dir_okay=False), default=None,
              help="a target machine's `pilotrun env --json` output: check the software stack against it")
@click.option("--rates", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="YAML of GPU → price per GPU-hour (optionally per plan): adds each plan's cost and the "
                   "cheapest plan that places every run")
@click.option("--gpu", default=None, metavar="KEY",
              show_default="the target env's GPU, else the fastest of hardware.memory_per_gpu that fits, else the "
                           "smallest that fits",
              help="plan for this catalogue GPU (" + ", ".join(BY_KEY) + ")")
@set_option
@common_options
def sheet(campaign, out, target_env, rates, gpu, sets, home, as_json):
    """Selection sheet, rental time plan, costs and launch files from the pilot's measurements."""
    from pilotrun.rehearsal.rental.sheet import sheet_stage

    loaded = load(campaign, sets)
    with stage_progress("sheet"):  # its options' traces: seconds each for a 70B model
        result = sheet_stage(loaded, home_for(home, campaign), target_env_path=target_env, gpu=gpu, out=out,
                             rates_path=rates, sets=tuple(sets))
    return emit(result, as_json)
