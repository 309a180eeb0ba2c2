"""``preference.reference: precomputed``: the reference's log-probabilities of every pair, computed once before
training with the starting model and kept beside the policy as a table; no reference model is resident afterwards
(the memory TRL's maintainers recommend saving, huggingface/trl#3168, TRL's ``precompute_ref_log_probs``).

A pair's entry is the starting model's log-probability of each half's answer tokens, summed (a loss that wants the
mean per token divides by the batch's target counts): keyed by the pair's ``rid`` and the fingerprint of its tokens
(``pair_fingerprint``: both halves' ids and labels after the cut), so a pair whose text, tokenizer, template or
``data.max_length`` changed no longer matches its entry. The table travels with the model (``model.__dict__``, like
the reference copy: in no state dict, copied by ``copy.deepcopy``), is written into every checkpoint the run saves
(``reference_logps.safetensors``: the values as a tensor, the keys and the set's fingerprint in its metadata; no
pickle), and read back with it, so a run resumed in a fresh process compares its policy with the log-probabilities
stored at its start, never with ones recomputed from a model that may have drifted. ``engine/loop.precompute_reference``
fills it; a resumed run (update > 0) whose stored entries do not cover its data, or no longer match it, is refused
(``stale``), exit 2.

The values are held as Python floats (each float32 value exactly), not as tensors. The table is host memory on every
device, and on a GPU run it never reaches the GPU's allocated bytes. On the CPU, the exact counter of live tensor bytes
(engine/tensors.py) stands for those bytes. As tensors, a run's table (every pair of its data) counted in every phase,
and again stacked at every save, while a pilot's holds only its worst-case pairs: the run's save read above the
pilot's bound (1.0000348 on 25 pairs), by more as the data grows. A batch's values become a tensor on its device only
when the loss asks for them (``lookup``), the same bytes in the pilot as in the run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pilotrun.errors import BadInput
from pilotrun import jsonsafe
from pilotrun.tasks.preference_loss import unwrapped

TABLE_ATTR = "pilotrun_reference_logps"
FILE = "reference_logps.safetensors"


def pair_fingerprint(e) -> str:
    """sha256 (16 hex digits) of a pair's tokens as the forward sees them: both halves' ids and labels."""
    m = e.meta
    body = json.dumps([list(e.input_ids), list(e.labels), list(m["rejected_ids"]), list(m["rejected_labels"])])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


class ReferenceLogps:
    """rid → (fingerprint, the reference's summed log-probability of the chosen answer, of the rejected one)."""

    def __init__(self, entries: dict | None = None, source: str | None = None):
        # rid -> (fingerprint, (chosen, rejected)): float32 values as Python floats, outside the tensor counter
        self.entries: dict[str, tuple[str, tuple[float, float]]] = dict(entries or {})
        self.source = source  # the file it was read from (a checkpoint's), for the messages

    def __len__(self) -> int:
        return len(self.entries)

    def fingerprint(self) -> str:
        """The set's fingerprint: sha256 over its pairs' rids and fingerprints, in rid order."""
        body = json.dumps(sorted((rid, fp) for rid, (fp, _) in self.entries.items()))
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def put(self, examples: list, chosen, rejected) -> None:
        import torch

        values = torch.stack([chosen, rejected], 1).detach().float().cpu().tolist()  # one copy for the batch
        for e, (c, r) in zip(examples, values, strict=True):
            self.entries[e.rid] = (pair_fingerprint(e), (c, r))

    def missing(self, examples: list) -> tuple[list, list]:
        """(the examples without an entry, those whose entry was computed on other tokens)."""
        absent, changed = [], []
        for e in examples:
            got = self.entries.get(e.rid)
            if got is None:
                absent.append(e)
            elif got[0] != pair_fingerprint(e):
                changed.append(e)
        return absent, changed

    def lookup(self, rids: list, device):
        """(chosen, rejected) summed log-probabilities of these pairs, on ``device``; None if one has no entry."""
        import torch

        if any(r not in self.entries for r in rids):
            return None
        both = torch.tensor([self.entries[r][1] for r in rids], dtype=torch.float32, device=device).reshape(-1, 2)
        return both[:, 0], both[:, 1]

    # --- the file ---------------------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """``folder/reference_logps.safetensors``: the values (pairs × 2, float32); rids, fingerprints and the
        set's fingerprint in the metadata. The caller's folder is written atomically (a checkpoint's)."""
        import numpy as np
        from safetensors.numpy import save_file

        rids = sorted(self.entries)
        values = np.array([self.entries[r][1] for r in rids], dtype=np.float32).reshape(-1, 2)  # no tensor: see above
        save_file({"logps": values}, str(Path(folder) / FILE),
                  metadata={"kind": "pilotrun-reference-logps", "fingerprint": self.fingerprint(),
                            "rids": json.dumps(rids), "pairs": json.dumps([self.entries[r][0] for r in rids])})

    @classmethod
    def load(cls, path: Path) -> "ReferenceLogps":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            values = f.get_tensor("logps").tolist()
        try:
            rids, fps = jsonsafe.loads(meta["rids"]), jsonsafe.loads(meta["pairs"])
            table = cls({r: (fp, _pair(v)) for r, fp, v in zip(rids, fps, values, strict=True)}, str(path))
        except (KeyError, ValueError, TypeError) as e:
            raise BadInput(f"the stored reference log-probabilities are unreadable ({type(e).__name__}: {e})",
                           where=str(path), fix="use a checkpoint written by pilotrun, or start the run again") \
                from None
        if meta.get("fingerprint") != table.fingerprint():
            raise BadInput("the stored reference log-probabilities do not match their own fingerprint (edited or "
                           "damaged)", where=str(path), fix="use a checkpoint written by pilotrun, or start the run "
                                                            "again")
        return table


def _pair(row) -> tuple[float, float]:
    """A stored row as (chosen, rejected); ValueError or TypeError unless it is two numbers."""
    chosen, rejected = row
    return float(chosen), float(rejected)


def table_of(model) -> ReferenceLogps | None:
    return unwrapped(model).__dict__.get(TABLE_ATTR)


def attach_table(model, table: ReferenceLogps) -> None:
    unwrapped(model).__dict__[TABLE_ATTR] = table


def stale(absent: list, changed: list, table: ReferenceLogps, update: int):
    """The BadInput of a resumed run whose stored reference log-probabilities do not cover or match its data."""
    if changed:
        what = (f"{len(changed)} pair(s) changed since they were computed (first: {changed[0].rid}: its tokens' "
                f"fingerprint {pair_fingerprint(changed[0])} is not the stored {table.entries[changed[0].rid][0]})")
    else:
        what = f"{len(absent)} pair(s) have none stored (first: {absent[0].rid})"
    return BadInput(f"the run resumes at update {update} with reference log-probabilities stored at its start "
                    f"(data fingerprint {table.fingerprint()}), but {what}: recomputing them now would take the "
                    "trained policy as the reference", where=table.source or "preference.reference",
                    fix="resume with the data (and data.max_length, tokenizer, template) the run started with, or "
                        "start a new run, which precomputes them afresh")
