"""estimate and fit: memory before the hardware exists, and variants that fit a limit."""

from __future__ import annotations

import click

from pilotrun.cli.common import campaign_argument, common_options, emit, home_for, load, set_option
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


@cli.command()
@campaign_argument
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="the device to predict for: cuda (the rental) or cpu (this machine, tensor bytes)")
@click.option("--gpu-memory", default=None, metavar="SIZE",
              show_default="hardware.memory_per_gpu for cuda", help="memory of one target GPU, e.g. 24GiB")
@click.option("--options", "options", is_flag=True,
              help="the options that fit, per catalogue GPU and count (checkpointing, FSDP, offload, LoRA, QLoRA), "
                   "with what each changes in the experiment")
@click.option("--lora-r", type=click.IntRange(1), default=None,
              help="LoRA rank for the adapter options (default: the campaign's adapter, else 16)")
@click.option("--rates", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="with --options: YAML of GPU → price per GPU-hour (as `sheet --rates`): each option's cost, and "
                   "the recommendation by cost")
@set_option
@common_options(home=False)
def estimate(campaign, device, gpu_memory, options, lora_r, rates, sets, home, as_json):
    """Predicted memory per phase on fake tensors: nothing is allocated, no GPU is needed."""
    from pilotrun.sizes import parse_size
    from pilotrun.rehearsal.memory.estimate import estimate as run_estimate

    if rates and not options:
        raise click.UsageError("--rates prices the options table: add --options")
    if options:
        from pilotrun.sheet.options_view import options_result
        from pilotrun.sheet.rates import read_rates

        priced = read_rates(rates) if rates else None  # a bad file is a bad input before anything is traced
        loaded = load(campaign, sets)
        with stage_progress("estimate"):  # a 70B model's options: a minute of traces on 2 cores
            result = options_result(loaded, rates=priced, lora_r=lora_r)
        return emit(result, as_json)
    limit = parse_size(gpu_memory, where="--gpu-memory") if gpu_memory else None
    loaded = load(campaign, sets)
    with stage_progress("estimate"):
        result = run_estimate(loaded, device=device, gpu_memory=limit)
    return emit(result, as_json)


@cli.command()
@campaign_argument
@click.option("--memory-limit", required=True, metavar="SIZE", help="the memory one rank may use, e.g. 24GiB")
@click.option("--write", "write_path", type=click.Path(dir_okay=False), default=None,
              help="write the chosen variant as a new campaign file, with a comment saying what changed and why")
@click.option("--effective-batch", type=click.IntRange(1), default=None,
              show_default="the campaign's", help="examples per update every variant must keep")
@click.option("--all-variants", is_flag=True, help="measure every variant, not only up to the first that fits")
@set_option
@common_options
def fit(campaign, memory_limit, write_path, effective_batch, all_variants, sets, home, as_json):
    """Variants that fit a memory limit, least change first, each measured and checked against the control."""
    from pilotrun.sizes import parse_size
    from pilotrun.rehearsal.memory.fit import fit as run_fit

    limit = parse_size(memory_limit, where="--memory-limit")
    loaded = load(campaign, sets)
    with stage_progress("fit"):
        result = run_fit(loaded, home_for(home, campaign), limit, write=write_path, effective_batch=effective_batch,
                         all_variants=all_variants)
    return emit(result, as_json)
