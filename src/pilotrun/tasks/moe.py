"""Mixture-of-experts facts the tasks need: the router's auxiliary loss the model's own forward adds, its routers.

transformers' MoE causal LMs (Mixtral, Qwen2/3-MoE, OLMoE, GraniteMoE, GPT-OSS) compute a load-balancing loss from
the router logits when ``config.output_router_logits`` is set and add ``config.router_aux_loss_coef`` × it to the
loss they return with labels; the HF Trainer, TRL and Axolotl train that sum. pilotrun's tasks compute the loss
from the logits themselves (a sum over the update's targets), so they add the same term here, from the same
forward's ``aux_loss``: off when the config leaves the router logits off, as transformers does. DeepSeek-V2/V3
and Llama 4 have no auxiliary loss (DeepSeek-V3 balances its experts with a bias, not a loss); no causal-LM family
of transformers 5 has a router z-loss (Switch and NLLB-MoE, encoder-decoders, do).
"""

from __future__ import annotations

from contextlib import contextmanager


def router_aux(model, out):
    """``router_aux_loss_coef × aux_loss`` of a forward's output, as a float32 scalar tensor (gradients flow to the
    routers), or None when the forward computed none (``output_router_logits`` off, or a family without one)."""
    aux = getattr(out, "aux_loss", None)
    if aux is None:
        return None
    coef = getattr(model.config, "router_aux_loss_coef", None)
    if not coef:
        return None
    return float(coef) * aux.float()


def plus_router_aux(model, out, total, n):
    """A task's loss (``total`` summed over ``n`` units: targets, or pairs) with the router's auxiliary loss of the
    forward ``out`` added as the trainers add it to their mean, once per unit: (total, n), or (total + part, n,
    {"router_aux": part}) for a forward that computed one (the loop logs the part apart)."""
    aux = router_aux(model, out)
    if aux is None:
        return total, n
    weighted = aux * n
    return total + weighted, n, {"router_aux": weighted.detach()}


def aux_loss_said(config) -> str | None:
    """What the loss holds besides the targets' cross-entropy, for a line of the rehearsal; None for a dense model."""
    coef = getattr(config, "router_aux_loss_coef", None)
    if coef is None:
        return None
    if getattr(config, "output_router_logits", False):
        return (f"the loss adds the router's load-balancing loss × {coef:g} (config.router_aux_loss_coef; "
                "output_router_logits is on), as transformers' forward and the trainers do")
    return ("the router's load-balancing loss is off (config.output_router_logits false), as in transformers' "
            f"forward: set model.config_overrides: {{output_router_logits: true}} to train it (× {coef:g})")


@contextmanager
def without_router_aux(model):
    """Inside, the model's forward computes no router auxiliary loss (``output_router_logits`` off): for checks of
    the targets' loss arithmetic, which a per-micro-batch load-balancing term is not meant to satisfy (its value
    depends on which tokens share a batch). Yields whether there was one to leave out."""
    config = getattr(model, "config", None)
    was = getattr(config, "output_router_logits", None)
    if not was or not getattr(config, "router_aux_loss_coef", None):
        yield False
        return
    config.output_router_logits = False
    try:
        yield True
    finally:
        config.output_router_logits = was


def moe_parts(model) -> tuple[list[str], list[str]]:
    """(the routers, the expert banks) of a model, by module name: transformers 5 names its router classes
    ``…Router`` (Mixtral's ``MixtralTopKRouter`` at ``mlp.gate``, Llama 4's ``Llama4Router``) and its fused expert
    banks ``…Experts``; both empty for a dense model."""
    routers, experts = [], []
    for name, m in model.named_modules():
        kind = type(m).__name__
        if "router" in kind.lower():
            routers.append(name)
        elif kind.endswith("Experts"):
            experts.append(name)
    return routers, experts


def adapted_moe_parts(parts: tuple[list[str], list[str]], adapted: list[str]) -> tuple[list[str], list[str]]:
    """Of the module names LoRA wrapped (``adapted``), the routers and the expert banks (``parts``: ``moe_parts`` of
    the model before LoRA wrapped it), by their last names."""
    routers, experts = parts

    def hit(names):
        return sorted({n.rpartition(".")[2] for n in names if any(a == n or a.endswith("." + n) for a in adapted)})
    return hit(routers), hit(experts)


def top_k_of(config) -> int | None:
    """Experts each token is routed to (``num_experts_per_tok``; ``moe_topk`` / ``top_k`` in a few families)."""
    for key in ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"):
        k = getattr(config, key, None)
        if isinstance(k, int) and not isinstance(k, bool) and k > 0:
            return k
    return None


def expert_counts(model) -> dict:
    """The routed experts of a model as the options table and the time plan need them: ``experts`` (per MoE layer),
    ``top_k``, ``moe_layers`` (banks), their parameters and bytes (``expert_params``, ``expert_bytes``) and the
    trainable part (``expert_trainable``, ``expert_trainable_bytes``); all 0 for a dense model. A shared expert is
    not routed: every token runs it, so it counts as an ordinary (active) parameter."""
    _, banks = moe_parts(model)
    out = {"experts": 0, "top_k": 0, "moe_layers": len(banks), "expert_params": 0, "expert_bytes": 0,
           "expert_trainable": 0, "expert_trainable_bytes": 0}
    if not banks:
        return out
    modules = dict(model.named_modules())
    for name in banks:
        for p in modules[name].parameters():
            n = p.numel()
            out["expert_params"] += n
            out["expert_bytes"] += n * p.element_size()
            if p.requires_grad:
                out["expert_trainable"] += n
                out["expert_trainable_bytes"] += n * p.element_size()
            if p.dim() == 3:
                out["experts"] = max(out["experts"], int(p.shape[0]))
    config = getattr(model, "config", None)
    out["top_k"] = top_k_of(config) or 0
    return out


def active(total: int, routed: int, experts: int, top_k: int) -> int:
    """Parameters a token runs through: all but the routed experts it is not sent to (``total`` less
    ``routed`` × (1 − top_k / experts)); ``total`` for a dense model."""
    if not experts or not top_k or not routed:
        return total
    return int(round(total - routed * (1 - min(top_k, experts) / experts)))


ROUTINGS = ("balanced", "skewed")


@contextmanager
def forced_routing(model, mode: str):
    """Inside, every expert bank receives the routing ``mode`` names instead of its router's choice (the routing
    weights stay the router's): ``balanced``, token i's j-th choice is expert (i·k + j) mod E, so every expert gets
    the same number of tokens; ``skewed``, every token goes to experts 0..k−1, the worst a dropless router (no
    capacity factor: transformers', the trainers') allows. Yields how many banks were forced: 0 where no bank takes
    an expert index (Llama 4's experts compute every token, weighted by its score: routing changes no cost)."""
    import torch

    _, banks = moe_parts(model)
    modules = dict(model.named_modules())
    forced = []

    def hook(module, args, kwargs):
        if len(args) < 2 or not isinstance(args[1], torch.Tensor) or args[1].is_floating_point():
            return None
        index = args[1]
        experts = next((int(p.shape[0]) for p in module.parameters() if p.dim() == 3), 0)
        if not experts or index.dim() != 2:
            return None
        tokens, k = index.shape
        if mode == "balanced":
            new = torch.arange(tokens * k, device=index.device).view(tokens, k) % experts
        else:
            new = torch.arange(k, device=index.device).expand(tokens, k)
        return (args[0], new.to(index.dtype).contiguous(), *args[2:]), kwargs

    handles = []
    for name in banks:
        handles.append(modules[name].register_forward_pre_hook(hook, with_kwargs=True))
        forced.append(name)
    try:
        yield len([n for n in forced if _takes_index(modules[n])])
    finally:
        for h in handles:
            h.remove()


def _takes_index(module) -> bool:
    """Whether an expert bank's forward takes the routers' expert indices (hidden, index, weights)."""
    import inspect

    try:
        return len(inspect.signature(module.forward).parameters) >= 3
    except (TypeError, ValueError):
        return False
