"""The options table's time arithmetic (sheet/options.py): FLOPs per update at ``plan.ASSUMED_MFU`` of a GPU's dense
rate over the data-parallel ranks, communication at the rates file's interconnect or the defaults below, not
overlapped with compute, an offloaded optimizer's host traffic and step; the words saying so are
``options._assumptions``."""

from __future__ import annotations

import math

from pilotrun.sheet import plan as P
from pilotrun.tasks.moe import active

# Defaults where the rates file names no interconnect (its `interconnect:` key, sheet/rates.py):
BUS_GBS = {"sxm": 150.0, "other": 16.0}  # effective all-reduce bus bandwidth per GPU within a node: NVLink's
# ring all-reduce on SXM parts measures in the low hundreds of GB/s (nccl-tests busbw), PCIe Gen4 x16 ~16-25
NODE_GBS = 12.5  # between nodes: 100 Gb/s per GPU, a conservative cloud default; rented H100 nodes often have
# 400 Gb/s InfiniBand or EFA per GPU (50 GB/s): say yours in the rates file
HOST_GBS = 16.0  # PCIe to the host, for an offloaded optimizer
HOST_PARAMS_S = 1.0e9  # parameters per second an optimizer step on the host updates (CPU Adam)
QLORA_SLOWER = 1.3  # 4-bit weights are dequantized before each matmul


def bus_gbs(g, n: int, net: dict | None = None) -> float:
    """GB/s per GPU of the all-reduce over ``n`` GPUs: the rates file's interconnect, else the defaults."""
    net = net or {}
    if n > 8:
        return net.get("inter_node_gbs") or NODE_GBS
    return net.get("intra_node_gbs") or BUS_GBS["sxm" if "sxm" in g.key or g.key in ("h200", "b200", "mi300x")
                                                 else "other"]


def campaign_seconds(g, n: int, tr: dict, strategy: str, offload: bool, qlora: bool, work: dict,
             passes: int) -> tuple[float, str]:
    """Campaign seconds on ``n`` GPUs of ``g``: every run one after another, each run on all n; a rank's
    ``passes`` (micro-batches per update) and validation batches take at least the launch floor each."""
    rate = g.rate_tflops(work["precision"]) * 1e12 * P.ASSUMED_MFU
    if rate <= 0:
        return math.inf, "no rate for this precision"
    params, trainable = active_counts(tr)  # a mixture of experts computes with its active parameters
    f_up = P.flops_per_update(params, trainable, work["tokens_update"], tr["gradient_checkpointing"],
                              work.get("reference", False))
    compute = max(f_up / n / rate * (QLORA_SLOWER if qlora else 1.0), P.GPU_FLOOR_S_PER_PASS * max(1, passes))
    bytes_param = tr["param_bytes"]
    comm = 0.0
    if strategy == "tp_fsdp":
        comm = _tp_comm(g, n, tr, work)
    elif strategy == "ep_fsdp":
        comm = _ep_comm(g, n, tr, work)
    elif n > 1:
        ring = (n - 1) / n / (bus_gbs(g, n, work.get("net")) * 1e9)
        comm = (3 * bytes_param if strategy == "fsdp" else 2 * tr["trainable_bytes"]) * ring
    host = 0.0
    if offload:
        share = tr["trainable_bytes"] / (n if strategy == "fsdp" else 1)
        host = 2 * share / (HOST_GBS * 1e9) + tr["trainable"] / (n if strategy == "fsdp" else 1) / HOST_PARAMS_S
    update = compute + comm + host
    forwards = 2 if work.get("reference") else 1  # a preference validation runs the reference's forward too
    evals = work["evals"] * max(2 * params * forwards * work["tokens_val"] / n / rate,
                                P.GPU_FLOOR_S_PER_PASS * math.ceil(work["eval_batches"] / n))
    per_run = work["updates"] * update + evals
    return per_run * work["runs"], (f"{work['runs']} run(s) × ({work['updates']} updates × {P.fmt_duration(update)} "
                                    f"+ {work['evals']} validations)")


def _tp_comm(g, n: int, tr: dict, work: dict) -> float:
    """Seconds of communication per update under TP × FSDP: within each node, 4 all-reduces of a layer's
    activations (tokens × hidden, 6 with checkpointing's recomputed forward) per decoder layer at the intra-node
    rate; across the nodes, FSDP's 3 × the TP shard of the parameters at the inter-node rate."""
    tp = work["tp"]
    t, nodes = tp["degree"], n // tp["degree"]
    net = work.get("net") or {}
    elem = 2 if work["precision"].startswith(("bf16", "fp16")) else 4
    per_layer = 6 if tr["gradient_checkpointing"] else 4
    acts = per_layer * (tp.get("layers") or 0) * work["tokens_update"] / nodes * (tp.get("hidden") or 0) * elem
    within = acts * 2 * (t - 1) / t / (bus_gbs(g, t, net) * 1e9)
    across = 3 * tr["param_bytes"] / t * (nodes - 1) / nodes / (bus_gbs(g, 16, net) * 1e9) if nodes > 1 else 0.0
    return within + across


def active_counts(tr: dict) -> tuple[int, int]:
    """(parameters, trainable parameters) a token computes with: a mixture of experts' total less the routed
    experts it is not sent to (tasks/moe.active); a dense model's own."""
    e, k = tr.get("experts") or 0, tr.get("top_k") or 0
    return (active(tr["params"], tr.get("expert_params") or 0, e, k),
            active(tr["trainable"], tr.get("expert_trainable") or 0, e, k))


def _ep_comm(g, n: int, tr: dict, work: dict) -> float:
    """Seconds of communication per update under expert parallel ×e + FSDP: FSDP moves 3 × the dense (non-expert)
    parameters over the n GPUs; the experts' gradients are reduced over their n / e replicas; and every MoE layer's
    tokens go to their experts and come back (dispatch and combine all-to-alls, top_k copies of a token's hidden
    state each way, forward and backward: 4, 6 with checkpointing), each rank sending (e − 1) / e of them."""
    e = work["ep"]
    net = work.get("net") or {}
    elem = 2 if work["precision"].startswith(("bf16", "fp16")) else 4
    dense = tr["param_bytes"] - (tr.get("expert_bytes") or 0)
    ring = (n - 1) / n / (bus_gbs(g, n, net) * 1e9)
    comm = 3 * dense * ring
    replicas = n // e
    if replicas > 1:
        comm += 2 * (tr.get("expert_trainable_bytes") or 0) / e * (replicas - 1) / replicas / \
            (bus_gbs(g, n, net) * 1e9)
    passes = 6 if tr["gradient_checkpointing"] else 4
    tokens = work["tokens_update"] / n  # a rank's own tokens: EP trades them, it does not divide them
    a2a = passes * (tr.get("moe_layers") or 0) * tokens * (tr.get("top_k") or 1) * (work.get("hidden") or 0) * elem
    return comm + a2a * (e - 1) / e / (bus_gbs(g, e, net) * 1e9)  # an EP group lies within a node
