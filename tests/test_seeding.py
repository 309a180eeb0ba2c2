"""Every weight a checkpoint does not provide is drawn under the campaign seed: a new head on real
pretrained weights (MiniLM), LoRA's A matrices; and a run that is not reproducible is named as such."""

import textwrap

import torch
import yaml
from conftest import minilm_campaign, simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.tasks import make_task

LORA = {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _build(path, **overrides):
    loaded = load_campaign(path)
    if overrides:
        loaded = loaded.with_overrides(overrides)
    torch.manual_seed(1234 + len(overrides))  # whatever the process's RNG holds must not matter
    torch.rand(7)
    return make_task(loaded).build_model()


def test_new_head_on_pretrained_encoder_is_bitwise_equal_across_builds(tmp_path):
    path = minilm_campaign(tmp_path)
    a, b = _build(path), _build(path, **{"name": "again"})
    assert torch.equal(a.classifier.weight, b.classifier.weight) and torch.equal(a.classifier.bias, b.classifier.bias)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    other = _build(path, **{"seed": 1})  # --seed draws another head, over the same pretrained body
    assert not torch.equal(a.classifier.weight, other.classifier.weight)
    assert torch.equal(a.bert.embeddings.word_embeddings.weight, other.bert.embeddings.word_embeddings.weight)


def test_lora_matrices_are_bitwise_equal_across_builds(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), model__adapter=LORA)
    a, b = _build(path), _build(path, **{"name": "again"})
    lora_a = [n for n, _ in a.named_parameters() if "lora_A" in n]
    assert lora_a
    sa, sb = dict(a.named_parameters()), dict(b.named_parameters())
    assert all(torch.equal(sa[n], sb[n]) for n in sa)
    other = dict(_build(path, **{"seed": 1}).named_parameters())
    assert not torch.equal(sa[lora_a[0]], other[lora_a[0]])


def _not_reproducible(cli, tmp_path, task: str, at_update: int) -> str:
    """resume with the custom task ``task`` (``Name:`` and its class, in a module of its own name: the test's process
    keeps what it imported): the verdict names the reference as not reproducible, first at ``at_update``, never the
    state; the problem it gives."""
    name = task.split(":", 1)[0]
    module = f"{name.lower()}_task"
    (tmp_path / f"{module}.py").write_text("import os\n\nimport torch\n\nfrom pilotrun.tasks.causal_lm import "
                                           "CausalLMTask\n\n\n" + textwrap.dedent(task.split(":", 1)[1]))
    path = tiny_causal_campaign(tmp_path, simple_records(24))
    c = yaml.safe_load(path.read_text())
    c["task"] = f"{module}:{name}"
    path.write_text(yaml.safe_dump(c))
    r = cli("resume", path, "--home", tmp_path / "home", "--at", "2", "--json")
    assert r.code == 1, r.out + r.err
    problem = r.json["data"]["problem"]
    assert r.json["summary"] == "the reference run itself is not reproducible"
    assert problem.startswith("the reference run itself is not reproducible: a second run of the same campaign, "
                              "which loads no state, already differs from it before update 2 (loss at update "
                              f"{at_update} is "), problem
    assert "not restored" not in problem and "seed it" in problem
    return problem


def test_unseeded_model_is_reported_as_a_not_reproducible_reference(cli, tmp_path):
    """A task whose model draws weights outside the campaign seed: resume blames the reference, not the state."""
    _not_reproducible(cli, tmp_path, """Unseeded:
        class Unseeded(CausalLMTask):
            def build_model(self):
                model = super().build_model()
                g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(0.05 * torch.randn(p.shape, generator=g))
                return model
    """, at_update=1)


def test_a_draw_after_the_first_update_is_named_not_reproducible_once_the_resume_differs(cli, tmp_path):
    """A draw outside the campaign seed from a model's second update on: the second run's update 1 agrees with the
    reference, the resumed run differs, and the second run goes on to K before the state is blamed."""
    _not_reproducible(cli, tmp_path, """LateDraw:
        class LateDraw(CausalLMTask):
            def loss(self, model, batch):
                total, targets = super().loss(model, batch)
                weight = next(model.parameters())
                if not hasattr(model, "first_weights"):
                    model.first_weights = weight.detach().clone()
                if not torch.equal(weight, model.first_weights):  # after an update: unseeded, as a late augmentation
                    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
                    total = total * (1 + 0.01 * torch.rand((), generator=g))
                return total, targets
    """, at_update=2)


def test_seeded_tiny_model_resumes(cli, tmp_path):
    """The clean case of the test above: the same campaign with the built-in task resumes exactly."""
    path = tiny_causal_campaign(tmp_path, simple_records(24))
    r = cli("resume", path, "--home", tmp_path / "home", "--at", "2", "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["summary"] == "resumes exactly at update 2 in a new process"
