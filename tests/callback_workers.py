"""The tiny real trainings behind the callback tests (HF Trainer and Lightning), in-process or one rank each.

As a script, ``python tests/callback_workers.py hf|lightning HOME OUT`` is one rank of a torchrun-style
launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment); it writes
``OUT/rank-R.json`` with the run id it recorded into. ``launch_ranks`` starts two of them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VOCAB, SEQ = 64, 16


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))


def _rows(n: int = 24):
    import torch

    g = torch.Generator().manual_seed(0)
    return [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, VOCAB, (n, SEQ), generator=g)]


# --- Hugging Face Trainer -----------------------------------------------------------------------------

def tiny_hf_trainer(tmp_path, callback, *, steps=4, eval_steps=2, save_steps=3, extra_callbacks=()):
    import torch
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    rows = _rows()
    args = TrainingArguments(output_dir=str(Path(tmp_path) / "out"), max_steps=steps, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, gradient_accumulation_steps=2, logging_steps=1,
                             eval_strategy="steps", eval_steps=eval_steps, save_strategy="steps",
                             save_steps=save_steps, report_to=[], use_cpu=True, learning_rate=1e-3, seed=0,
                             disable_tqdm=True)
    return Trainer(model=_llama(), args=args, train_dataset=rows, eval_dataset=rows[:8],
                   callbacks=[callback, *extra_callbacks])


def poison_hf_after(step: int):
    """A TrainerCallback that fills the embeddings with NaN after optimizer step ``step`` (a planted defect)."""
    from transformers import TrainerCallback

    class Poison(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step == step:
                import torch

                with torch.no_grad():
                    model.get_input_embeddings().weight.fill_(float("nan"))

    return Poison()


def raise_hf_at(step: int):
    """A TrainerCallback that raises at the end of optimizer step ``step`` (a crash inside the user's loop)."""
    from transformers import TrainerCallback

    class Crash(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == step:
                raise RuntimeError(f"planted crash at step {step}")

    return Crash()


# --- Lightning ----------------------------------------------------------------------------------------

def _module_class():
    import lightning.pytorch as pl
    import torch

    class TinyCausalLM(pl.LightningModule):
        """A tiny Llama trained as a causal LM; keeps its micro-batch losses for the tests to compare."""

        def __init__(self, lr: float = 1e-3, poison_after: int | None = None, raise_at: int | None = None):
            super().__init__()
            self.save_hyperparameters()
            self.model = _llama()
            self.micro_losses: list[float] = []

        def training_step(self, batch, batch_idx):
            if self.hparams.raise_at is not None and self.trainer.global_step + 1 == self.hparams.raise_at:
                raise RuntimeError(f"planted failure at update {self.hparams.raise_at}")
            loss = self.model(**batch).loss
            self.micro_losses.append(float(loss.detach()))
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.hparams.poison_after is not None and self.trainer.global_step == self.hparams.poison_after:
                with torch.no_grad():
                    self.model.get_input_embeddings().weight.fill_(float("nan"))

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.model(**batch).loss, batch_size=batch["input_ids"].shape[0], sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

        def update_losses(self, sizes: list[int]) -> list[float]:
            """The mean micro-batch loss of each update, given how many micro-batches each had."""
            out, i = [], 0
            for n in sizes:
                out.append(sum(self.micro_losses[i:i + n]) / n)
                i += n
            return out

    return TinyCausalLM


def fit_tiny(tmp_path, callback, *, steps=4, rows=24, poison_after=None, raise_at=None, **trainer_kwargs):
    """Fit the tiny Llama: micro-batches of 4, accumulate_grad_batches=2, validation every 2 updates
    (plus a one-batch sanity check), a ModelCheckpoint every 3 updates. Returns the Trainer."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    previous = os.environ.get("PL_GLOBAL_SEED")
    pl.seed_everything(0, verbose=False)
    try:
        module = _module_class()(lr=1e-3, poison_after=poison_after, raise_at=raise_at)
        rows = _rows(rows)
        ckpt = ModelCheckpoint(dirpath=str(Path(tmp_path) / "ckpt"), every_n_train_steps=3, save_top_k=-1)
        kwargs = dict(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=2,
                      val_check_interval=4, check_val_every_n_epoch=None, num_sanity_val_steps=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
        kwargs.update(trainer_kwargs)
        trainer = pl.Trainer(callbacks=[callback, ckpt], **kwargs)
        trainer.fit(module, DataLoader(rows, batch_size=4), DataLoader(rows[:8], batch_size=4))
        return trainer
    finally:
        if previous is None:
            os.environ.pop("PL_GLOBAL_SEED", None)
        else:
            os.environ["PL_GLOBAL_SEED"] = previous


# --- one rank of a 2-process launch ---------------------------------------------------------------------

def _rank_main(framework: str, home: str, out: str) -> None:
    import torch

    torch.set_num_threads(1)  # two ranks share the cores
    rank = int(os.environ["RANK"])
    extra = {}
    if framework == "hf":
        from pilotrun.integrations.hf_trainer import PilotrunCallback

        cb = PilotrunCallback(home=home, name="hf-2ranks")
        trainer = tiny_hf_trainer(out, cb)
        trainer.train()
        world = trainer.args.world_size
    else:
        from pilotrun.integrations.lightning import PilotrunCallback

        cb = PilotrunCallback(home=home, name="lightning-2ranks")
        # 32 rows: 16 per rank, 4 micro-batches, 2 whole updates per epoch
        trainer = fit_tiny(out, cb, rows=32, devices=2, strategy="ddp")
        world = trainer.world_size
        extra = {"update_losses": trainer.lightning_module.update_losses([2, 2, 2, 2])}
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_initialized() else None
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "run_id": cb.run_id, "world": world,
                                                          "backend": backend, **extra}))


def one_run_of_two_ranks(ranks: list[dict], home: Path, kind: str) -> tuple[dict, dict]:
    """What both callbacks promise on 2 ranks: one completed run of ``kind`` that rank 0 created and rank 1
    joined, every row ok with real counters, written before rank 0 finished the run. Returns the run
    and its rows per (phase, rank)."""
    from pilotrun.journal.store import Journal

    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert {r["backend"] for r in ranks} == {"gloo"}
    assert ranks[0]["run_id"] == ranks[1]["run_id"]  # rank 0 created it, rank 1 got its id
    journal = Journal(home)
    runs = journal.list_runs()
    assert [r["run_id"] for r in runs] == [ranks[0]["run_id"]]
    run = runs[0]
    assert run["kind"] == kind and run["status"] == "completed"
    rows = journal.phase_rows(run["run_id"])
    assert run["summary"]["phases"] == len(rows)  # rank 0 finished after rank 1 wrote its rows
    per_rank: dict = {}
    for r in rows:
        per_rank.setdefault((r["phase"], r["rank"]), []).append(r)
        assert r["verdict"] == "ok" and r["peak_allocated"] > 0 and r["duration_s"] > 0
    return run, per_rank


def launch_ranks(framework: str, home: Path, out: Path, nproc: int = 2, timeout: float = 240) -> list[dict]:
    """Start ``nproc`` processes of this script with torchrun's environment; return their rank-R.json."""
    from pilotrun.engine.launcher import start_scripts

    out.mkdir(parents=True, exist_ok=True)
    codes = start_scripts([__file__, framework, str(home), str(out)], nproc, out, timeout=timeout)
    failed = [rank for rank, rc in enumerate(codes) if rc != 0]
    if failed:
        logs = "\n".join(f"--- rank {r} ---\n" + (out / f"rank-{r}.log").read_text()[-4000:] for r in failed)
        raise AssertionError(f"rank(s) {failed} failed:\n{logs}")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


def _crash_main(home: str, out: str) -> None:
    """A script whose trainer.train() raises and ends the process (the HF crash test)."""
    from pilotrun.integrations.hf_trainer import PilotrunCallback

    cb = PilotrunCallback(home=home, name="hf-crash")
    trainer = tiny_hf_trainer(Path(out), cb, steps=4, eval_steps=10, save_steps=10,
                              extra_callbacks=[raise_hf_at(2)])
    try:
        trainer.train()  # raises; nothing here catches it
    finally:
        Path(out, "run_id").write_text(cb.run_id or "")


if __name__ == "__main__" and sys.argv[1] == "hf-crash":
    _crash_main(*sys.argv[2:4])
elif __name__ == "__main__":
    _rank_main(*sys.argv[1:4])
    from pilotrun.engine.distributed import exit_rank

    exit_rank(0)  # as pilotrun's own ranks end: gloo can abort the interpreter's finalisation
