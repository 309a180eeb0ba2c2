"""``pilotrun import``: a campaign from the user's Axolotl YAML or Hugging Face ``TrainingArguments`` / TRL
``SFTConfig`` / ``DPOConfig`` dict (JSON or YAML).

Every setting the source gives is either carried into a campaign key (``Carried``) or named with what its
absence does to the rehearsal (``NotCarried``). The keys each tool knows are the tools' own (``schemas``: data
generated from their classes, or the installed tool's classes); an unknown key is a typo (exit 2) only when it is
a letter or two from a known key the file does not set, else it is named (``keys``). Whatever the import cannot
decide (which fields are prompt and response, one training file of several) it asks for, exit 2; offline preference
configs (Axolotl's ``rl: dpo|ipo|orpo|simpo``, TRL's DPOConfig) are the preference task (``preference``); online RL
and the other preference methods (``rl``) and other tools' formats (``foreign``) are refused with what to do instead. The campaign is
written atomically with a comment block listing what was not carried, and carries that list as
``imported.not_carried`` so ``all`` and the sheet can say it.

The package, one job per module: ``source`` reads the file and tells its format, ``foreign`` refuses other
tools' files, ``schemas`` the tools' keys, ``keys`` the unknown-key rule, ``values`` each value against its declared
type, ``builder`` the campaign being built,
``settings`` what both tools spell alike, ``preference`` offline preference configs, ``rl`` RL refusals, ``axolotl`` and ``axolotl_data``
Axolotl's YAML, ``datafiles`` a data set's local file, ``hf`` TrainingArguments / SFTConfig, ``trl_cli`` a TRL
CLI file's model and data, ``reasons`` what leaving a setting out does, ``render`` the commented YAML,
``convert`` the verb's one call, ``said`` what ``all`` and the sheet say.
"""

from pilotrun.campaign.importers.builder import Carried, Imported, NotCarried
from pilotrun.campaign.importers.convert import import_config
from pilotrun.campaign.importers.said import not_reproduced_lines
from pilotrun.campaign.importers.source import FORMATS

__all__ = ["FORMATS", "Carried", "Imported", "NotCarried", "import_config", "not_reproduced_lines"]
