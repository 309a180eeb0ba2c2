"""Preference and reinforcement-learning configs: never imported as a supervised campaign.

An Axolotl ``rl:`` (any value), ``reward_model`` / ``process_reward_model``, or a TRL ``DPOConfig`` dict trains
something other than next-token prediction on one response; rehearsing it as SFT would give figures of another
experiment. Each is exit 2 naming the key that says it, with the reason: online RL (``grpo``, ``ppo`` ...) generates
and scores completions, which pilotrun does not rehearse; offline preference methods (``dpo``, ``ipo``, ``orpo``,
``kto``, ``simpo`` ...) train on chosen and rejected responses: pilotrun's preference task rehearses them where it is
present (``task: preference``), and until it is they are refused like the rest.
"""

from __future__ import annotations

from typing import Any

from pilotrun.campaign.importers.builder import Builder

ONLINE = {"grpo", "ppo", "gspo", "online_dpo", "rloo", "reinforce", "ebft", "dapo", "gkd"}
OFFLINE = {"dpo", "ipo", "orpo", "kto", "simpo", "cpo", "bco", "apo_zero", "apo_down", "sft_dpo", "rpo"}


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
        why = (f"{key}: {value} trains on preference pairs (a chosen and a rejected response per prompt): pilotrun "
               "rehearses preference tuning with its preference task, which this version does not have; importing "
               "it as supervised fine-tuning would give the figures of another experiment")
        fix = "remove `rl:` (and the preference keys) to rehearse a supervised fine-tune of the chosen responses instead"
    b.ask(why, fix)
