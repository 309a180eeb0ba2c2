"""Reinforcement-learning configs and the preference methods pilotrun does not rehearse: never imported as a
supervised campaign.

An Axolotl ``rl:`` other than ``dpo``, ``ipo``, ``orpo`` and ``simpo`` (which ``preference.py`` imports as
``task: preference``), or ``reward_model`` / ``process_reward_model``, trains something other than next-token
prediction on one response; rehearsing it as SFT would give figures of another experiment. Each is exit 2 naming the
key that says it, with the reason: online RL (``grpo``, ``ppo`` ...) generates and scores completions during training,
which pilotrun does not rehearse; the other offline preference methods (``kto``: unpaired answers; ``cpo``, ``bco``
...) are not among the preference task's losses.
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
        unpaired = " (it learns from unpaired good and bad answers, not from pairs)" if name == "kto" else ""
        why = (f"{key}: {value} is a preference method pilotrun does not rehearse{unpaired}: its preference task "
               "(task: preference) trains dpo, ipo, simpo and orpo on a chosen and a rejected answer per prompt; "
               "importing it as supervised fine-tuning would give the figures of another experiment")
        fix = ("set rl: dpo (or ipo, simpo, orpo) on pairs of answers to rehearse preference tuning, or remove `rl:` "
               "to rehearse a supervised fine-tune of the chosen answers")
    b.ask(why, fix)
