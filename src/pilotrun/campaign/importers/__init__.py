"""``pilotrun import``: a campaign from the user's Axolotl YAML or Hugging Face ``TrainingArguments`` / TRL
``SFTConfig`` dict (JSON or YAML).

Every setting the source gives is either carried into a campaign key (``Carried``) or named with what its
absence does to the rehearsal (``NotCarried``); a key the source tool itself does not know is a typo (exit
2, naming the nearest known key), since Axolotl ignores unknown keys silently. Whatever the import cannot
decide (which fields are prompt and response, one training file of several) it asks for, exit 2. The
campaign is written atomically with a comment block listing what was not carried, and carries that list
as ``imported.not_carried`` so ``all`` and the sheet can say it. Neither Axolotl nor TRL is imported: the
key lists are written here from their documentation (the HF keys are TrainingArguments' own fields).

The package, one job per module: ``source`` reads the file and tells its format, ``keys`` the keys each tool
knows, ``builder`` the campaign being built, ``settings`` what both tools spell alike, ``axolotl`` and
``axolotl_data`` Axolotl's YAML, ``hf`` TrainingArguments / SFTConfig, ``reasons`` what leaving a setting out
does, ``render`` the commented YAML, ``convert`` the verb's one call, ``said`` what ``all`` and the sheet say.
"""

from pilotrun.campaign.importers.builder import Carried, Imported, NotCarried
from pilotrun.campaign.importers.convert import import_config
from pilotrun.campaign.importers.said import not_reproduced_lines
from pilotrun.campaign.importers.source import FORMATS

__all__ = ["FORMATS", "Carried", "Imported", "NotCarried", "import_config", "not_reproduced_lines"]
