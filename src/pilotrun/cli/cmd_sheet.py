"""env and sheet: the software stack of this machine, and the selection sheet with the rental plan."""

from __future__ import annotations

import click

from pilotrun.cli.common import campaign_argument, common_options, emit, home_for, load
from pilotrun.cli.main import cli


@cli.command()
@common_options(home=False)
def env(home, as_json):
    """Software stack: Python, torch, CUDA/cuDNN/NCCL, devices, bf16, attention kernels, key packages."""
    from pilotrun.cli.common import console
    from pilotrun.stages.env import env_markdown, env_stage

    result = env_stage()
    console(as_json).print(env_markdown(result.data), markup=False, highlight=False, end="")
    return emit(result, as_json, rendered=True)


@cli.command()
@campaign_argument
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="also write the sheet as Markdown here")
@click.option("--target-env", type=click.Path(dir_okay=False), default=None,
              help="a target machine's `pilotrun env --json` output: check the software stack against it")
@click.option("--gpu", default=None, metavar="KEY",
              show_default="the target env's GPU, else the fastest of hardware.memory_per_gpu that fits, else the "
                           "smallest that fits",
              help="plan for this catalogue GPU (t4, rtx4090, l4, a10, l40s, a100-40gb, a100-80gb, h100-pcie, "
                   "h100-sxm, h200)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a campaign key (repeatable)")
@common_options
def sheet(campaign, out, target_env, gpu, sets, home, as_json):
    """Selection sheet and rental time plan from the pilot's measurements."""
    from pilotrun.stages.sheet import sheet_stage

    result = sheet_stage(load(campaign, sets), home_for(home, campaign), target_env_path=target_env, gpu=gpu,
                         out=out)
    if out and "written" in result.data:
        click.echo(f"sheet written to {out}", err=True)
    return emit(result, as_json)
