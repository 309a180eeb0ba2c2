"""Every README code block that can run here is run, line by line, in the README's order.

Each fenced block is found by parsing README.md; each command line (and each Python block) is classified
below: fast (run by the unmarked test), slow (run with the rest by the `slow` test: full stages on the
demo), or skipped with the reason it cannot run here. A README line nobody classified fails the test, so a
new example is run or its skip is argued. Placeholders are replaced by real values: the example run ids by
the id of the run the README's own `train` line made (prefixes by prefixes of it), `RUN_ID` likewise, the
sweep id by the sweep's, `/tmp/pilot-demo` by a folder here. `campaign.yaml` is the demo campaign with 4
updates and one seed (the README's lines as written, on a campaign that runs in seconds).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from test_readme import HARNESS as OWN_LOOP  # the own-loop block's harness, one for both tests

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Lines that cannot run here, each with why (matched against the command line).
SKIP = {
    r"^make demo\b": "creates .venv and installs torch and pilotrun: the set-up CI itself runs before the tests",
    r"^make test\b": "runs this test suite: it would run itself",
    r"--ray auto\b": "needs a Ray cluster this machine is attached to (test_sweep_ray starts a local one)",
    r"^sky (jobs )?launch\b": "launches rented GPU machines through SkyPilot",
}
NOT_COMMANDS = {"json": "the JSON envelope's shape, not a command", "text": "sample output, not a command"}
# Lines that run full stages (the demo's `all`, sweeps, two gloo ranks): the slow test runs them.
SLOW = [r"^pilotrun demo\b", r"^pilotrun all\b", r"^cd examples && pilotrun all\b", r"train\.nproc=2",
        r"^pilotrun sweep\b", r"^pilotrun fit\b", r"^pilotrun overfit\b", r"^pilotrun pilot\b", r"^pilotrun resume\b",
        r"--options\b", r"^pilotrun sheet\b", r"^pilotrun export\b", r"--track\b"]
SLOW_PYTHON = ("PilotrunTrainerCallback", "PilotrunLightningCallback")
FAST = [r"^pilotrun (init|import|validate|train|runs|show|note|inspect|leakage|split|estimate|verify|archive|report|env)\b"]

EXAMPLE_ID = re.compile(r"(?<!sweep-)\b20261202-\d{4,6}(-[0-9a-f]{6})?\b")


@dataclass
class Block:
    line: int
    lang: str
    text: str


def readme_blocks() -> list[Block]:
    out, lines = [], README.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            out.append(Block(i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n"))
            i = j
        i += 1
    return out


def classify(block: Block) -> list[tuple[str, str, int]]:
    """(how, what, README line) per runnable unit: how is fast, slow or 'skip: why'."""
    if block.lang in NOT_COMMANDS:
        return [(f"skip: {NOT_COMMANDS[block.lang]}", block.text, block.line)]
    if block.lang == "python":
        how = "slow" if any(k in block.text for k in SLOW_PYTHON) else "fast"
        return [(how, block.text, block.line)]
    assert block.lang == "sh", f"README.md:{block.line}: a ```{block.lang} block: classify it in {__file__}"
    units = []
    for k, raw in enumerate(block.text.splitlines()):
        cmd = raw.split("  #")[0].strip()
        if not cmd:
            continue
        skip = next((why for pat, why in SKIP.items() if re.search(pat, cmd)), None)
        how = (f"skip: {skip}" if skip else "slow" if any(re.search(p, cmd) for p in SLOW)
               else "fast" if any(re.search(p, cmd) for p in FAST) else None)
        assert how, f"README.md:{block.line + 1 + k}: `{cmd}` is not classified in {__file__}"
        units.append((how, cmd, block.line + 1 + k))
    return units


def test_every_readme_block_is_classified_and_few_are_skipped():
    units = [u for b in readme_blocks() for u in classify(b)]
    skipped = [u for u in units if u[0].startswith("skip")]
    commands = [u for u in skipped if not u[0].startswith(("skip: the JSON", "skip: sample"))]
    assert len(commands) <= 4, commands  # make demo, make test, --ray auto, sky launch
    assert sum(u[0] == "fast" for u in units) >= 15


# --- the workspace the lines run in -----------------------------------------------------------------
LLAMA_70B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
             "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def _workspace(root: Path) -> Path:
    from pilotrun.demo.synth import write_demo

    ws = root / "ws"
    path = write_demo(ws, n_conversations=80)
    c = yaml.safe_load(path.read_text())
    c["train"].update(updates=4, eval_every=2, save_every=None, warmup=0)
    c["plan"]["seeds"] = [0]
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    records = [json.loads(ln) for s in ("train", "validation", "test") for ln in (ws / "data" / f"{s}.jsonl").open()]
    (ws / "data" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (ws / "rates.yaml").write_text("h100-sxm: 2.0\n")
    big = dict(c, name="llama70b", model={"config": LLAMA_70B, "tokenizer": "byte"})
    (ws / "llama70b.yaml").write_text(yaml.safe_dump(big, sort_keys=False))
    shutil.copytree(ROOT / "examples", ws / "examples", ignore=shutil.ignore_patterns(".pilotrun", "__pycache__"))
    (ws / "backups").mkdir()
    shim = root / "bin" / "pilotrun"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m pilotrun \"$@\"\n")
    shim.chmod(0o755)
    return ws


class Runner:
    def __init__(self, ws: Path, monkeypatch):
        self.ws, self.ids = ws, {}
        monkeypatch.chdir(ws)
        monkeypatch.delenv("PILOTRUN_HOME", raising=False)
        monkeypatch.setenv("PILOTRUN_WIDTH", "160")
        self.env = dict(os.environ, PATH=f"{ws.parent / 'bin'}:{os.environ['PATH']}",
                        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))

    def substitute(self, cmd: str) -> str:
        cmd = cmd.replace("/tmp/pilot-demo", str(self.ws / "pilot-demo"))
        if self.ids.get("sweep"):
            cmd = re.sub(r"\bsweep-20261202-\d{4}\b", lambda m: self.ids["sweep"][:len(m.group(0))], cmd)
        run_id = self.ids.get("run")
        if run_id:
            cmd = EXAMPLE_ID.sub(lambda m: self.unique_prefix(run_id, len(m.group(0))), cmd).replace("RUN_ID", run_id)
        return cmd

    def unique_prefix(self, run_id: str, n: int) -> str:
        """The README example's prefix length of ``run_id``, longer only where the runs this test made in the same
        minute share it (``show`` refuses an ambiguous prefix, exit 2, as it should)."""
        from pilotrun.journal.store import Journal

        ids = [r["run_id"] for r in Journal(self.ws / ".pilotrun", create=False).list_runs()]
        while n < len(run_id) and sum(i.startswith(run_id[:n]) for i in ids) > 1:
            n += 1
        return run_id[:n]

    def shell(self, cmd: str, line: int) -> subprocess.CompletedProcess:
        p = subprocess.run(["bash", "-c", self.substitute(cmd)], cwd=self.ws, env=self.env, capture_output=True,
                           text=True, timeout=900)
        assert p.returncode in (0, 1), f"README.md:{line}: `{cmd}` exit {p.returncode}\n{p.stderr[-3000:]}"
        return p

    def cli(self, cmd: str, line: int, capsys) -> str:
        from pilotrun.cli.main import run

        argv = shlex.split(self.substitute(cmd), comments=True)
        assert argv[0] == "pilotrun"
        capsys.readouterr()
        code = run(argv[1:])
        out, err = capsys.readouterr()
        assert code in (0, 1), f"README.md:{line}: `{cmd}` exit {code}\n{err[-3000:]}"
        return out

    def python(self, text: str, line: int, harness: str) -> None:
        script = self.ws / f"readme_{line}.py"
        script.write_text(harness + text)
        p = subprocess.run([sys.executable, str(script)], cwd=self.ws, env=self.env, capture_output=True, text=True,
                           timeout=900)
        assert p.returncode == 0, f"README.md:{line}: the python block failed\n{p.stderr[-3000:]}"

    def run_unit(self, what: str, line: int, lang: str, capsys) -> None:
        if lang == "python":
            return self.python(what, line, _harness(what))
        if re.search(r"[|>&]|^cd ", what):
            self.shell(what, line)
        else:
            out = self.cli(what, line, capsys)
            if what.startswith("pilotrun train") and "--json" in what:
                self.ids["run"] = json.loads(out)["data"]["run_id"]
        if what.startswith("pilotrun sweep") and "--continue" not in what:
            from pilotrun.journal.store import Journal
            from pilotrun.report.html import latest_sweep_id

            self.ids["sweep"] = latest_sweep_id(Journal(self.ws / ".pilotrun", create=False))


HF = '''
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
ds = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(8)]
args = TrainingArguments(output_dir="hf-out", max_steps=2, per_device_train_batch_size=4, report_to=[],
                         logging_steps=1, save_strategy="no", use_cpu=True)
'''

LIGHTNING = '''
import torch
import lightning.pytorch as pl

class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        loss = self.net(batch).pow(2).mean()
        self.log("train_loss", loss)
        return loss
    def validation_step(self, batch, i):
        self.log("val_loss", self.net(batch).pow(2).mean())
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

module = Module()
train_loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4)
val_loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)
'''


def _harness(text: str) -> str:
    if "PilotrunTrainerCallback" in text:
        return HF
    if "PilotrunLightningCallback" in text:
        return LIGHTNING
    return OWN_LOOP


def _run_readme(tmp_path, monkeypatch, capsys, hows: tuple[str, ...]) -> list[str]:
    runner = Runner(_workspace(tmp_path), monkeypatch)
    if "slow" not in hows:  # `pilotrun demo --out /tmp/pilot-demo` is slow: the workspace, a demo folder, stands in
        (runner.ws / "pilot-demo").symlink_to(runner.ws)
    ran = []
    for block in readme_blocks():
        for how, what, line in classify(block):
            if how in hows:
                runner.run_unit(what, line, block.lang, capsys)
                ran.append(what)
    return ran


def test_the_fast_readme_lines_run(tmp_path, monkeypatch, capsys):
    ran = _run_readme(tmp_path, monkeypatch, capsys, ("fast",))
    from pilotrun.journal.store import Journal

    j = Journal(tmp_path / "ws" / ".pilotrun", create=False)
    kinds = [r["kind"] for r in j.list_runs()]
    assert "train" in kinds and len(kinds) >= 2, kinds  # the README's train line and its own-loop block
    assert (tmp_path / "ws" / "my-classifier" / "campaign.yaml").is_file()
    assert (tmp_path / "ws" / "backups" / "run.tar.gz").is_file()
    assert json.loads((tmp_path / "ws" / "target-env.json").read_text())["ok"] is True
    assert any("--tensorboard" in r for r in ran) and any("| python -c" in r for r in ran)


@pytest.mark.slow
def test_every_runnable_readme_line_runs(tmp_path, monkeypatch, capsys):
    ran = _run_readme(tmp_path, monkeypatch, capsys, ("fast", "slow"))
    assert any(r.startswith("pilotrun sweep") for r in ran) and any(r.startswith("pilotrun demo") for r in ran)
    assert (tmp_path / "ws" / "sheet.md").is_file() and (tmp_path / "ws" / "sheet.sky.yaml").is_file()
