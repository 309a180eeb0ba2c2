"""The preference losses on per-half log-probabilities, and the reference model kept beside a policy.

Pure tensor functions (the task calls them; tests check them against the papers' formulas):

- dpo (Rafailov et al. 2023, TRL's ``loss_type="sigmoid"``): −log σ(β·[(π_c − ref_c) − (π_r − ref_r)]), the
  log-probabilities summed over each answer's tokens; rewards β·(π − ref).
- ipo (Azar et al. 2023, TRL's ``ipo``): ([(π_c − ref_c) − (π_r − ref_r)] − 1/(2τ))², on per-token mean
  log-probabilities (as TRL normalises it, with the authors' agreement); rewards β·(π − ref).
- simpo (Meng et al. 2024, TRL's CPO ``loss_type="simpo"`` with ``cpo_alpha=0``): −log σ(β·(π̄_c − π̄_r) − γ), per-token
  means, no reference; rewards β·π̄.
- orpo (Hong et al. 2024, TRL's ORPOTrainer): −π̄_c + λ·(−log σ(log odds_c − log odds_r)), log odds = π̄ − log(1 − e^π̄),
  per-token means, no reference; rewards λ·π̄.

KTO is not here: it learns from unpaired good and bad answers (and a KL estimate across mismatched pairs), not
from a chosen and a rejected answer to one prompt. Online methods (GRPO, PPO, online DPO) generate during training:
pilotrun does not rehearse them (campaign/importers/rl.py refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOSSES = ("dpo", "ipo", "simpo", "orpo")
REFERENCE_FREE = ("simpo", "orpo")
DEFAULT_BETA = {"dpo": 0.1, "ipo": 0.1, "simpo": 2.0, "orpo": 0.1}  # TRL's DPOConfig, CPOConfig (simpo), ORPOConfig
MEAN_PER_TOKEN = ("ipo", "simpo", "orpo")
REFERENCE_ATTR = "pilotrun_reference"
REFERENCE_KIND_ATTR = "pilotrun_reference_kind"  # what the build made the reference (a variant's build may differ)


def beta_of(p) -> float:
    """The campaign's β (``preference.beta``), or its loss's default."""
    return float(p.beta) if p.beta is not None else DEFAULT_BETA[p.loss]


def reference_kind(c) -> str:
    """What ``preference.reference: auto`` means for this campaign: none (simpo, orpo), adapter (under LoRA), copy."""
    p = c.preference
    if p.reference != "auto":
        return p.reference
    if p.loss in REFERENCE_FREE:
        return "none"
    return "adapter" if c.model.adapter is not None else "copy"


@dataclass
class PairTerms:
    """One batch's per-pair terms (tensors of the batch's pairs): the loss, the rewards and what they came from."""

    losses: Any
    chosen_rewards: Any
    rejected_rewards: Any
    chosen: Any  # the policy's log-probability of each half (summed, or the mean per token: MEAN_PER_TOKEN)
    rejected: Any


def _log1mexp(x):
    """log(1 − eˣ) for x < 0, stable at both ends (branch at −log 2)."""
    import torch

    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def pair_terms(loss: str, beta: float, gamma: float, policy: tuple, reference: tuple | None) -> PairTerms:
    """``policy``/``reference``: (chosen, rejected) log-probabilities per pair, already summed or averaged as the
    loss wants (``MEAN_PER_TOKEN``); ``reference`` is None for simpo and orpo."""
    import torch.nn.functional as F

    pc, pr = policy
    if loss in ("dpo", "ipo"):
        rc, rr = reference
        chosen_ratio, rejected_ratio = pc - rc, pr - rr
        delta = chosen_ratio - rejected_ratio
        losses = -F.logsigmoid(beta * delta) if loss == "dpo" else (delta - 1 / (2 * beta)) ** 2
        return PairTerms(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach(), pc, pr)
    if loss == "simpo":
        losses = -F.logsigmoid(beta * (pc - pr) - gamma)
    elif loss == "orpo":
        log_odds = (pc - pr) - (_log1mexp(pc) - _log1mexp(pr))
        losses = -pc - beta * F.logsigmoid(log_odds)
    else:
        raise ValueError(f"unknown preference loss {loss!r}")
    return PairTerms(losses, beta * pc.detach(), beta * pr.detach(), pc, pr)


# --- the reference model kept beside the policy ---------------------------------------------------------------
def unwrapped(model):
    """The module under a DDP wrapper (``.module``), else the model itself."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def attach_reference(model, reference) -> None:
    """Keep ``reference`` (frozen, eval mode) beside ``model``: in its ``__dict__``, not as a submodule, so it is in
    no state dict, checkpoint, artifact or optimizer, and ``copy.deepcopy(model)`` copies it with the policy."""
    reference.eval()
    reference.requires_grad_(False)
    model.__dict__[REFERENCE_ATTR] = reference


def mark_reference(model, kind: str) -> None:
    """Say on the model what its reference is (copy, adapter, none): the builder knows; a task serving several
    builds (the options table's variants: LoRA's reference is the adapter-disabled base) reads it per model."""
    model.__dict__[REFERENCE_KIND_ATTR] = kind


def reference_kind_of(model) -> str | None:
    return unwrapped(model).__dict__.get(REFERENCE_KIND_ATTR)


def reference_of(model):
    """The frozen reference copy kept beside a policy (``attach_reference``), or None."""
    return unwrapped(model).__dict__.get(REFERENCE_ATTR)


def resident_bytes(model) -> int:
    """Bytes of the reference copy's parameters and buffers (0 without one)."""
    ref = reference_of(model)
    if ref is None:
        return 0
    return sum(t.numel() * t.element_size() for t in list(ref.parameters()) + list(ref.buffers()))
