"""Config errors exit 2 with the key path and a fix; --set parses typed values."""

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign, write_campaign


def _edit(path, fn):
    c = yaml.safe_load(path.read_text())
    fn(c)
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def test_clean_campaign_validates_and_prints_arithmetic(cli, demo_campaign):
    r = cli("validate", demo_campaign, "--json")
    assert r.code == 0, r.err
    a = r.json["data"]["arithmetic"]
    assert a["examples_per_update"] == a["micro_batch"] * a["accumulation"] * a["ranks"]
    assert "examples per update" in r.err and "updates per epoch" in r.err and "drop_last" in r.err


def test_unknown_key_suggests_the_right_one(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["train"].update(acumulation=4))
    r = cli("validate", demo_campaign)
    assert r.code == 2
    assert "unknown key 'train.acumulation'" in r.err
    assert "did you mean 'train.accumulation'" in r.err
    assert f"{demo_campaign}:" in r.err  # names the file and line
    assert "Traceback" not in r.err


def test_unknown_key_reports_its_line(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    text = path.read_text().replace("train:\n", "train:\n  lrr: 0.1\n", 1)
    path.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "lrr" in ln)
    r = cli("validate", path)
    assert r.code == 2 and f"{path}:{line}" in r.err and "did you mean 'train.lr'" in r.err


def test_wrong_type_names_key_and_value(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["train"].update(micro_batch="eight"))
    r = cli("validate", demo_campaign)
    assert r.code == 2
    assert "train.micro_batch" in r.err and '"eight"' in r.err and "fix:" in r.err


@pytest.mark.parametrize("section, key, written", [
    ("train", "micro_batch", "on"), ("train", "warmup", "off"), ("train", "lr", "yes"), ("train", "updates", "true"),
    ("hardware", "gpus", "true"), ("hardware", "rental_days", "[3, yes]"), ("plan", "seeds", "[0, on]"),
])
def test_a_yes_or_no_is_not_taken_for_a_number(cli, demo_campaign, section, key, written):
    # YAML 1.1 reads on/off/yes/no as booleans and pydantic's lax mode reads those as 1 and 0: `micro_batch: on`
    # rehearsed one example per pass and `warmup: off` none, and validate said ok
    _edit(demo_campaign, lambda c: c.setdefault(section, {}).update({key: yaml.safe_load(written)}))
    r = cli("validate", demo_campaign)
    assert r.code == 2, r.err
    assert f"{section}.{key}:" in r.err and "is a yes/no where a number belongs" in r.err, r.err
    assert "fix: write" in r.err and "as a number" in r.err
    # a number as a string stays accepted: --set train.lr=3e-4 arrives as the string YAML 1.1 leaves it
    r = cli("validate", demo_campaign, "--set", f"{section}.{key}=[3]" if written.startswith("[") else
            f"{section}.{key}=3e-4" if key == "lr" else f"{section}.{key}=2")
    assert r.code == 0, r.err


@pytest.mark.parametrize("days, said", [("[]", "[] plans no rental"), ("[3, 3]", "[3, 3] lists a length twice")])
def test_rental_days_are_some_distinct_lengths(cli, demo_campaign, days, said):
    # [] gave a sheet with no plan and no launch files, and [3, 3] the same plan twice, both without a word
    r = cli("validate", demo_campaign, "--set", f"hardware.rental_days={days}")
    assert r.code == 2 and f"hardware.rental_days: {said}" in r.err and "fix: list distinct lengths" in r.err, r.err


def test_negative_size_refused(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["train"].update(accumulation=0))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and "train.accumulation" in r.err and "greater than 0" in r.err


def test_missing_data_file(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["data"].update(validation="data/nope.jsonl"))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and "nope.jsonl" in r.err and "data file not found (named by data.validation)" in r.err
    assert "a file of a close name" not in r.err, r.err


def test_a_misspelt_data_path_names_its_key_and_the_near_match(cli, demo_campaign):
    """Issue 43 saw ``data/trian.jsonl`` named by neither its key nor the file meant; here the validation split's
    ``data/vaildation.jsonl`` (another key, another slip): both said, and the fix sets the key to the file."""
    data = demo_campaign.parent / "data"
    real = next(p for p in sorted(data.iterdir()) if p.name.startswith("val"))
    slip = real.name[0] + real.name[2] + real.name[1] + real.name[3:]
    _edit(demo_campaign, lambda c: c["data"].update(validation=f"data/{slip}"))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and "data file not found (named by data.validation)" in r.err, r.err
    assert f"a file of a close name is beside it: {data / real.name}" in r.err
    assert f"fix: set data.validation to {data / real.name}" in r.err


def test_missing_field_in_records(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["data"].update(response="answer"))
    r = cli("validate", demo_campaign)
    assert r.code == 2
    assert "no field 'answer'" in r.err and "data.response" in r.err and "train.jsonl:1" in r.err


def test_template_fields_must_exist(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["data"].update(prompt="Q: {question}\nA: "))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and "no field 'question'" in r.err and "data.prompt" in r.err


def test_task_needs(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c.update(task="seq-cls"))
    r = cli("validate", demo_campaign)
    assert r.code == 2
    for key in ("data.text", "data.label", "data.labels"):
        assert key in r.err


def test_both_budgets_refused(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["train"].update(epochs=2))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and "train.updates or train.epochs" in r.err


def test_epochs_budget_arithmetic(cli, demo_campaign):
    _edit(demo_campaign, lambda c: c["train"].update(epochs=2, updates=None))
    r = cli("validate", demo_campaign, "--json")
    a = r.json["data"]["arithmetic"]
    assert a["budget_from"] == "train.epochs" and a["updates"] == 2 * a["updates_per_epoch"]


def test_broken_yaml_names_line(cli, tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text("name: x\ntrain:\n  lr: [1\n  micro_batch: 2\n")
    r = cli("validate", path)
    assert r.code == 2 and "invalid YAML" in r.err and f"{path}:" in r.err


def test_set_typed_parsing(cli, demo_campaign):
    r = cli("validate", demo_campaign, "--set", "train.lr=3e-4", "--set", "train.drop_last=false",
            "--set", "train.micro_batch=3", "--json")
    assert r.code == 0, r.err
    from pilotrun.campaign import load_campaign, parse_set

    c = load_campaign(demo_campaign, parse_set(["train.lr=3e-4", "train.drop_last=false"])).campaign
    assert c.train.lr == pytest.approx(3e-4) and c.train.drop_last is False


def test_set_of_a_control_key_sets_that_dotted_key():
    # plan.control's keys are dotted keys: --set plan.control.train.lr=0.1 made a nested {train: {lr: 0.1}} that
    # nothing read, beside the control's train.lr, which stayed as it was
    from pilotrun.campaign.load import apply_overrides

    raw = {"plan": {"control": {"train.lr": 0.003}, "variants": [{"train.lr": 0.01}]}}
    assert apply_overrides(raw, {"plan.control.train.lr": 0.1})["plan"]["control"] == {"train.lr": 0.1}
    assert apply_overrides({"plan": {"control": None}}, {"plan.control.model.config.hidden_size": 64}) == {
        "plan": {"control": {"model.config.hidden_size": 64}}}


def test_set_of_a_key_that_takes_text_is_the_text_written():
    """YAML read a template as a mapping (data.prompt={question}, and "Q: {question}: {answer}" as no YAML at all),
    a name as a date or a number, and each was refused as not a string; where the key takes only text, the text
    written is the value (YAML's own quoting and null still apply)."""
    from pilotrun.campaign import parse_set

    assert parse_set(["data.prompt={question}", "data.response=Q: {question}: {answer}", "name=2024-01-01",
                      "data.group_by=123", "data.train=true", 'model.path="my model"', "data.test=null"]) == {
        "data.prompt": "{question}", "data.response": "Q: {question}: {answer}", "name": "2024-01-01",
        "data.group_by": "123", "data.train": "true", "model.path": "my model", "data.test": None}
    # keys that take other things keep YAML's reading
    assert parse_set(["train.micro_batch=3", "data.labels=[a, b]", "model.config={a: 1}"]) == {
        "train.micro_batch": 3, "data.labels": ["a", "b"], "model.config": {"a": 1}}


@pytest.mark.parametrize("item, message", [
    ("train.lrr=0.1", "did you mean 'train.lr'"),
    ("trian.lr=0.1", "did you mean 'train.lr'"),
    ("train.lr", "not KEY=VALUE"),
    ("train.micro_batch=big", "train.micro_batch"),
    # --set values are read within the campaign file's bounds: an alias bomb (validate took 34 s and 640 MB on
    # this one, nine times that one level deeper) and a nesting thousands deep (a RecursionError, exit 3)
    ("model.config.x=[&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], "
     "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], "
     "&g [*f,*f,*f,*f,*f,*f,*f,*f,*f]]", "--set model.config.x: the value anchored at line 1 is repeated"),
    ("model.config=" + "[" * 5000 + "]" * 5000, "--set model.config: invalid YAML: exceeded maximum nesting depth"),
    ("model.config={a: 1, a: 2}", "key 'a' appears twice in one mapping"),
    # an item of a list: "did you mean 'plan.variants.train.lr'" (no such key either), or "set the whole value"
    ("plan.variants[0].train.lr=0.1", "'plan.variants' is a list, and --set takes no item of it; cannot set "
     "'plan.variants[0].train.lr'\n  fix: set the whole list: --set 'plan.variants=[...]' (its value now: "
     "[{train.lr: 0.001}, {train.lr: 0.01}])"),
    ("plan.variants.1.train.lr=0.1", "'plan.variants' is a list, and --set takes no item of it"),
    ("hardware.rental_days.0=5", "fix: set the whole list: --set 'hardware.rental_days=[...]' (its value now: "
     "[3, 7, 30])"),
    ("plan.control.train.lrr=0.1", "plan.control: unknown key 'train.lrr'"),
    # a comma in a number: YAML's text, "set train.lr to a valid value" said nothing of it
    ("train.lr=0,001", "fix: write 0.001 (a decimal point: YAML reads 0,001 as text)"),
    ("train.micro_batch=1,000", "fix: write 1000 (no thousands separator: YAML reads 1,000 as text)"),
    # an exponent past what a float holds: 1e-400 read as lr 0 (overfit then failed on "train.lr = 0"), 1e400 as
    # infinity; as YAML's float, as the text YAML 1.1 leaves, and quoted
    ("train.lr=1e-400", "--set train.lr: 1e-400 is smaller than any number a float holds (about 5e-324): it would "
     "read as 0\n  fix: check the exponent"),
    ("train.lr=1.0e-400", "1.0e-400 is smaller than any number a float holds"),
    ('train.lr="1e-400"', "train.lr: 1e-400 is smaller than any number a float holds (about 5e-324): it would "
     "read as 0\n  fix: check the exponent"),
    ("train.weight_decay=1e400", "1e400 is larger than any number a float holds (about 1.8e308): it would read as "
     "infinity"),
    # a whole number written with an exponent is read as one; one that is not whole says what it is
    ("train.updates=2.5e0", "train.updates: 2.5e0 is 2.5, not a whole number\n  fix: write a whole number"),
    ("train.warmup=1e-1", "train.warmup: 1e-1 is 0.1, not a whole number"),
])
def test_bad_set(cli, demo_campaign, item, message):
    r = cli("validate", demo_campaign, "--set", item)
    assert r.code == 2, r.err
    assert message in r.err and "Traceback" not in r.err


def test_a_whole_number_written_with_an_exponent_is_read_as_that_number(cli, demo_campaign):
    """`updates: 1e3` is text to YAML 1.1 (an exponent without a dot), and pydantic refused it: "unable to parse
    string as an integer", where `1.0e+3` (a YAML float) was read as 1000. Both are 1000 now, in the file and
    through --set, in a list too; a float's exponent past its range is refused at its line."""
    from pilotrun.campaign import load_campaign

    text = demo_campaign.read_text()
    assert "updates: 12\n" in text and "\n  lr: 0.003\n" in text and "  - 30\n" in text
    demo_campaign.write_text(text.replace("updates: 12\n", "updates: 1e3\n").replace("  - 30\n", "  - 3E1\n"))
    c = load_campaign(demo_campaign).campaign
    assert c.train.updates == 1000 and c.hardware.rental_days == [3, 7, 30]
    r = cli("validate", demo_campaign, "--set", "train.eval_every=5e1", "--set", "train.warmup=1.0e+1", "--json")
    assert r.code == 0, r.err
    assert "budget (train.updates): 1000 updates" in r.err
    line = 1 + next(i for i, ln in enumerate(text.splitlines()) if ln.strip() == "lr: 0.003")
    demo_campaign.write_text(text.replace("\n  lr: 0.003\n", "\n  lr: 3.0e-400\n"))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and f"campaign.yaml:{line}: 3.0e-400 is smaller than any number a float holds" in r.err, r.err


def test_a_path_holding_a_shell_variable_says_it_is_not_expanded(cli, demo_campaign, monkeypatch):
    """`data.train: $DATA/train.jsonl` was "data file not found" of <campaign folder>/$DATA/train.jsonl: YAML reads
    the variable as text. It is named, with its value here, unless a path of that very name exists."""
    monkeypatch.setenv("PILOTRUN_TEST_DATA", str(demo_campaign.parent / "data"))
    monkeypatch.delenv("PILOTRUN_TEST_UNSET", raising=False)
    for value, said, fix in [
        ("$PILOTRUN_TEST_DATA/train.jsonl", "data.train: '$PILOTRUN_TEST_DATA/train.jsonl' holds $PILOTRUN_TEST_DATA: "
         "a campaign file's paths are read as written, no variable expanded",
         f"fix: write the path itself ({demo_campaign.parent / 'data' / 'train.jsonl'} with $PILOTRUN_TEST_DATA as "
         "this shell has it)"),
        ("${PILOTRUN_TEST_UNSET}/train.jsonl", "holds ${PILOTRUN_TEST_UNSET}", "($PILOTRUN_TEST_UNSET is not set here "
         "either), or let the shell expand it: --set data.train=\"${PILOTRUN_TEST_UNSET}/train.jsonl\""),
    ]:
        r = cli("validate", demo_campaign, "--set", f"data.train={value}")
        assert r.code == 2 and said in r.err and fix in r.err, r.err
    (demo_campaign.parent / "$odd").mkdir()  # a folder really named so is read
    (demo_campaign.parent / "data" / "train.jsonl").rename(demo_campaign.parent / "$odd" / "train.jsonl")
    assert cli("validate", demo_campaign, "--set", "data.train=$odd/train.jsonl").code == 0


@pytest.mark.parametrize("key", ["model.path", "model.tokenizer", "data.train", "data.validation", "data.test"])
def test_a_path_holding_a_nul_character_is_bad_input(cli, demo_campaign, key):
    """YAML's "\\0" escape put a NUL in a path: os.stat raised ValueError ("embedded null byte"), exit 3 (found by
    trying every key of the demo campaign with 15 values of other types)."""
    section, name = key.split(".")
    _edit(demo_campaign, lambda c: c[section].update({name: "data/tr\x00ain.jsonl"}))
    r = cli("validate", demo_campaign)
    assert r.code == 2 and f"{key}: 'data/tr\\x00ain.jsonl' holds a NUL character" in r.err, r.err


def test_paths_relative_to_campaign_file(tmp_path, monkeypatch):
    from pilotrun.campaign import load_campaign

    path = tiny_causal_campaign(tmp_path / "proj", simple_records(8))
    monkeypatch.chdir(tmp_path)
    c = load_campaign(path).campaign
    assert c.data.train == str((tmp_path / "proj" / "data" / "train.jsonl").resolve())


def test_init_writes_valid_commented_starters(cli, tmp_path):
    from pilotrun.campaign.schema import Campaign

    for task in ("causal-lm", "seq-cls", "preference"):
        folder = tmp_path / task
        r = cli("init", folder, "--task", task)
        assert r.code == 0, r.err
        text = (folder / "campaign.yaml").read_text()
        assert "#" in text and f"task: {task}" in text
        Campaign.model_validate(yaml.safe_load(text))
    assert cli("init", tmp_path / "causal-lm").code == 2  # no silent overwrite


def test_validate_is_fast_without_torch(tmp_path):
    """validate must not import torch or transformers (it answers in well under a second), nor a tracker's
    package for a campaign that logs to one."""
    import subprocess
    import sys

    path = tiny_causal_campaign(tmp_path, simple_records(8), track__to="mlflow")
    code = ("import sys; from pilotrun.cli.main import run; rc = run(['validate', %r]);"
            "heavy = [m for m in ('torch', 'transformers', 'mlflow', 'wandb') if m in sys.modules];"
            "assert not heavy, heavy; sys.exit(rc)" % str(path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_write_campaign_helper_roundtrip(tmp_path):
    p = write_campaign(tmp_path, {"name": "x"})
    assert yaml.safe_load(p.read_text()) == {"name": "x"}


def test_override_paths_relative_to_campaign_file(tmp_path, monkeypatch):
    from pilotrun.campaign import load_campaign

    path = tiny_causal_campaign(tmp_path / "proj", simple_records(8))
    monkeypatch.chdir(tmp_path)
    loaded = load_campaign(path).with_overrides({"data.validation": "data/other.jsonl"})
    assert loaded.campaign.data.validation == str((tmp_path / "proj" / "data" / "other.jsonl").resolve())


@pytest.mark.parametrize("prompt, said", [
    ("Q: {question", "its braces do not pair (expected '}' before end of string)"),
    ("Q: {question} }", "its braces do not pair (Single '}' encountered in format string)"),
    ('Answer in JSON like {"a": 1}. Q: {question}', 'the placeholder {"a": 1} formats the field'),
    ("{question:d}", "the placeholder {question:d} formats the field (:d: a width or a format code)"),
    ("{question!a}", "the placeholder {question!a} converts the field (!a: its repr"),
    ("{question!s}", "the placeholder {question!s} converts the field (!s)"),
    ("{}", "the placeholder {} names no field (a positional placeholder)"),
    ("{0}: {question}", "the placeholder {0} names no field"),
    ("{question.upper}", "reads an attribute or an item of the field"),
    ("{question[0]}", "reads an attribute or an item of the field"),
])
def test_a_prompt_template_is_fields_and_doubled_braces_only(prompt, said, tmp_path):
    """data.prompt is rendered with str.format, so anything of Python's format language but {field} and {{ }} is
    refused when the campaign is read, naming the placeholder, with the way to write a literal brace."""
    from pilotrun.campaign.load import campaign_from_dict
    from pilotrun.errors import BadInput

    with pytest.raises(BadInput) as e:
        campaign_from_dict({"data": {"prompt": prompt}}, tmp_path)
    assert "data.prompt" in str(e.value) and said in str(e.value), str(e.value)
    assert "double it ({{ or }})" in e.value.fix


@pytest.mark.parametrize("prompt", ["question", "", "Q: {question}\nA: ", "{{literal}} and {question} in {{braces}}",
                                    "{topic}: {question with spaces}"])
def test_a_plain_prompt_template_is_taken(prompt, tmp_path):
    from pilotrun.campaign.load import campaign_from_dict

    assert campaign_from_dict({"data": {"prompt": prompt}}, tmp_path).campaign.data.prompt == prompt
