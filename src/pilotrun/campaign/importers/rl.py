"""Reinforcement-learning configs and the preference methods pilotrun does not rehearse: never imported as a
supervised campaign.

An Axolotl ``rl:`` other than ``dpo``, ``ipo``, ``orpo`` and ``simpo`` (which ``preference.py`` imports as
``task: preference``), or ``reward_model`` / ``process_reward_model``, trains something other than next-token
prediction on one response; rehearsing it as SFT would give figures of another experiment. Each is exit 2 naming the
key that says it, with the reason: online RL (``grpo``, ``ppo`` ...) generates and scores completions during training,
which pilotrun does not rehearse; the other offline preference methods (``kto``: unpaired answers; ``cpo``, ``bco``
...) are not among the preference task's losses. A TRL config dict is refused the same way by a key only another
trainer's config has (``TRL_KEYS``: GRPOConfig's num_generations, PPOConfig's num_ppo_epochs, KTOConfig's
desirable_weight ...): a GRPOConfig also holds DPOConfig's ``beta`` and would otherwise import as DPO.
"""

from __future__ import annotations

from typing import Any

from pilotrun.campaign.importers.builder import Builder

ONLINE = {"grpo", "ppo", "gspo", "online_dpo", "rloo", "reinforce", "ebft", "dapo", "gkd"}
OFFLINE = {"dpo", "ipo", "orpo", "kto", "simpo", "cpo", "bco", "apo_zero", "apo_down", "sft_dpo", "rpo"}
# keys of TRL's other trainers' configs that TrainingArguments, SFTConfig and DPOConfig lack (a dict dumped from one
# holds them; a GRPOConfig also holds DPOConfig's beta): the trainer each names
TRL_KEYS = {"num_generations": "GRPOConfig", "reward_weights": "GRPOConfig", "num_iterations": "GRPOConfig",
            "scale_rewards": "GRPOConfig", "mask_truncated_completions": "GRPOConfig",
            "use_vllm": "GRPOConfig / OnlineDPOConfig / RLOOConfig", "vllm_mode": "GRPOConfig / OnlineDPOConfig",
            "num_ppo_epochs": "PPOConfig", "vf_coef": "PPOConfig", "cliprange_value": "PPOConfig",
            "whiten_rewards": "PPOConfig", "kl_coef": "PPOConfig / RLOOConfig", "rloo_k": "RLOOConfig",
            "reward_model_path": "PPOConfig / RLOOConfig", "missed_eos_penalty": "OnlineDPOConfig",
            "lmbda": "GKDConfig", "seq_kd": "GKDConfig",
            "desirable_weight": "KTOConfig", "undesirable_weight": "KTOConfig", "cpo_alpha": "CPOConfig"}
TRL_OFFLINE = {"KTOConfig": "kto", "CPOConfig": "cpo"}


def trl_trainer_key(raw: dict[str, Any], known: set[str]) -> str | None:
    """A key set in a TRL config dict that only another trainer's config has (``TRL_KEYS``, not in ``known``)."""
    return next((k for k in raw if k in TRL_KEYS and k not in known and raw[k] not in (None, False, [], "")), None)


def refuse_trl(b: Builder, key: str, value: Any) -> None:
    """Exit 2 naming a TRL key of another trainer: online RL, or a preference method pilotrun does not rehearse."""
    trainer = TRL_KEYS[key]
    if trainer in TRL_OFFLINE:
        b.ask(f"{key}: {value!r} is a key of TRL's {trainer} ({TRL_OFFLINE[trainer]}), a preference method pilotrun "
              "does not rehearse: its preference task trains dpo, ipo, simpo and orpo (a DPOConfig) on a chosen and a "
              "rejected answer per prompt", "rehearse a DPOConfig dict (loss_type sigmoid, ipo, ...) on pairs of "
              "answers, or a TrainingArguments/SFTConfig dict on the chosen answers")
        return
    b.ask(f"{key}: {value!r} is a key of TRL's {trainer}, online reinforcement learning (completions generated and "
          "scored during training, a reference or reward model beside the policy): pilotrun does not rehearse it, "
          "and importing it as supervised fine-tuning or DPO would give the figures of another experiment",
          "rehearse the supervised stage before it: a TrainingArguments/SFTConfig dict on a data set of prompts with "
          "responses (its memory is a lower bound of the RL run's), or a DPOConfig dict on pairs of answers")


def refuse(b: Builder, key: str, value: Any) -> None:
    """Exit 2 naming ``key`` (``rl``, ``reward_model``, the DPOConfig key) and why it is not imported."""
    name = str(value).lower()
    if key in ("reward_model", "process_reward_model"):
        why = (f"{key}: true trains a reward model (a scalar head on preference pairs), not a language model's "
               "next-token loss; pilotrun does not rehearse it")
        fix = f"remove {key} to rehearse the supervised fine-tune of the same model and data instead"
    elif name in ONLINE or key == "rl" and name not in OFFLINE:
        why = (f"{key}: {value} is online reinforcement learning (completions generated and scored during training, "
               "a reference or value model beside the policy): pilotrun does not rehearse it, and importing it as "
               "supervised fine-tuning would give the figures of another experiment")
        fix = ("rehearse the supervised stage before it: remove `rl:` and give a data set of prompts with responses "
               "(its memory is a lower bound of the RL run's)")
    else:
        unpaired = " (it learns from unpaired good and bad answers, not from pairs)" if name == "kto" else ""
        why = (f"{key}: {value} is a preference method pilotrun does not rehearse{unpaired}: its preference task "
               "(task: preference) trains dpo, ipo, simpo and orpo on a chosen and a rejected answer per prompt; "
               "importing it as supervised fine-tuning would give the figures of another experiment")
        fix = ("set rl: dpo (or ipo, simpo, orpo) on pairs of answers to rehearse preference tuning, or remove `rl:` "
               "to rehearse a supervised fine-tune of the chosen answers")
    b.ask(why, fix)
