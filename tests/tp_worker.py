"""One rank of transformers' own tensor-parallel plan on CPU over gloo (started by tests/test_tp_gloo.py through
engine/launcher.start_scripts): the model loaded with tp_plan="auto", one forward and backward on the same
batch as the unsharded model; this rank's parameter elements and both losses to OUT/rank-R.json."""

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM


def main(model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tp = AutoModelForCausalLM.from_pretrained(model_dir, tp_plan="auto")
    plain = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(1)
    x = torch.randint(0, plain.config.vocab_size, (2, 8))
    loss = tp(x, labels=x).loss
    loss.backward()
    local = {n: (p.to_local() if hasattr(p, "to_local") else p).numel() for n, p in tp.named_parameters()}
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump({"loss": loss.item(), "plain_loss": plain(x, labels=x).loss.item(), "local": local,
                   "full": {n: p.numel() for n, p in plain.named_parameters()},
                   "grads": all(p.grad is not None for p in tp.parameters())}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
