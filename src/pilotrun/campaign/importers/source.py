"""Reading the source config: size-bounded, UTF-8, JSON or safe YAML; a pickle refused unread; the format told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotrun.campaign import yamlsafe
from pilotrun.errors import EXPONENT_FIX, BadInput, beyond_a_float, utf8_of
from pilotrun import jsonsafe

FORMATS = ("axolotl", "hf")
MAX_BYTES = 1 << 20


def _refuse_pickle(path: Path, head: bytes) -> None:
    """A pickle (training_args.bin is torch.save'd TrainingArguments) is refused by its name or first bytes;
    it is never unpickled: loading a pickle runs whatever code it names."""
    pickled = path.suffix.lower() in (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
    if pickled or head[:1] == b"\x80" or head[:2] == b"PK":
        raise BadInput(f"{path.name} is a pickle (torch.save of TrainingArguments), which pilotrun never loads: "
                       "unpickling runs any code the file names", where=str(path),
                       fix="in the session that trained, write the arguments as JSON: "
                           "`open('args.json', 'w').write(trainer.args.to_json_string())`, then "
                           "`pilotrun import args.json`")


class _BeyondAFloat(ValueError):
    pass


def _a_float_holds(text: str) -> float:
    """A JSON number as ``json`` reads it, unless it is past what a float holds (``"learning_rate": 1e-400`` read
    as 0, and imported as lr 0)."""
    problem = beyond_a_float(text)
    if problem:
        raise _BeyondAFloat(problem, text)
    return float(text)


def read_source(path: Path) -> dict[str, Any]:
    try:
        if not path.is_file():
            raise BadInput("config file not found", where=str(path), fix="pass the Axolotl YAML or the arguments' JSON")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise BadInput(f"cannot read the config: {e.strerror or e}", where=str(path),
                       fix="check the path and its permissions") from None
    _refuse_pickle(path, data[:4])
    if len(data) > MAX_BYTES:
        raise BadInput(f"the config holds more than {MAX_BYTES >> 10} KiB", where=str(path),
                       fix="pass the training config itself, not a data file")
    text = utf8_of(data, path)
    if path.suffix.lower() == ".json":
        try:
            raw = jsonsafe.loads(text, parse_float=_a_float_holds)
        except _BeyondAFloat as e:  # the number's first place as written: JSON's reader gives no position
            line = text[:max(text.find(e.args[1]), 0)].count("\n") + 1
            raise BadInput(e.args[0], where=f"{path}:{line}", fix=EXPONENT_FIX) from None
        except ValueError as e:
            raise BadInput(f"not valid JSON: {e}", where=str(path), fix="write the arguments with to_json_string()") from None
    else:
        raw, _ = yamlsafe.load_bounded(text, str(path))
    if not isinstance(raw, dict):
        raise BadInput("the config must be a mapping of keys", where=str(path),
                       fix="pass an Axolotl YAML or the dict TrainingArguments.to_dict() writes")
    return raw


def detect(raw: dict[str, Any], path: Path) -> str:
    """axolotl or hf (TrainingArguments / TRL dicts and `trl` CLI files), by the keys only each has."""
    ax = {"base_model", "datasets", "micro_batch_size", "sequence_len", "num_epochs", "lora_r", "adapter",
          "pretraining_dataset", "base_model_config"}
    hf = {"per_device_train_batch_size", "num_train_epochs", "lr_scheduler_type", "optim", "output_dir",
          "max_seq_length", "eval_strategy", "evaluation_strategy", "model_name_or_path", "dataset_name"}
    a, h = len(ax & set(raw)), len(hf & set(raw) - {"output_dir"})
    if a and a >= h:
        return "axolotl"
    if h:
        return "hf"
    raise BadInput("cannot tell the config's format (no Axolotl key such as base_model or micro_batch_size, no "
                   "TrainingArguments or TRL key such as per_device_train_batch_size or model_name_or_path)",
                   where=str(path), fix="say it: --from axolotl or --from hf")
