"""The optimizer kernel pilotrun steps with (engine/optim.kernel): torch's fused AdamW/SGD on CPU, torch's default
elsewhere; the estimator traces the same kernel as the run, and a checkpoint never changes it."""

import pytest
import torch
from conftest import simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.campaign.prepare import prepare
from pilotrun.engine.loop import make_state, run_update
from pilotrun.engine.optim import kernel, make_optimizer
from pilotrun.engine.state import load_state, save_state


def _prep(tmp_path, **overrides):
    return prepare(load_campaign(tiny_causal_campaign(tmp_path, simple_records(12), **overrides)))


def _state(prep, seed=0):
    torch.manual_seed(seed)
    return make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=10)


def _update(prep, state):
    return run_update(state, prep.task, [[prep.train[i] for i in mb] for mb in state.sampler.next_update()],
                      max_grad_norm=1.0)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_steps_every_element_fused_where_torch_steps_it_right(tmp_path, optimizer, dtype):
    """Fused: AdamW in every floating dtype, SGD in fp32 (torch's fused CPU SGD skips elements in bf16/fp16)."""
    prep = _prep(tmp_path, train__optimizer=optimizer, train__lr=0.25, train__weight_decay=0.0)
    model = prep.task.build_model().to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)  # 0.5 - a step of 0.25 (SGD) or ~0.25 (AdamW's first) is exact in every dtype
    opt = make_optimizer(model, prep.c.train)
    assert type(opt) is (torch.optim.AdamW if optimizer == "adamw" else torch.optim.SGD)
    fused = optimizer == "adamw" or dtype == torch.float32
    assert all(bool(g["fused"]) is fused and not g["foreach"] for g in opt.param_groups)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for p in model.parameters():  # every element stepped, none left at 0.5
        assert float((p.detach().float() - 0.25).abs().max()) < 1e-3, p.shape


def test_fused_adamw_is_as_close_to_fp64_as_torch_default_in_low_precision():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        w, grads = torch.randn(4099).to(dtype), [torch.randn(4099).to(dtype) for _ in range(5)]

        def stepped(dt, **kw):
            p = torch.nn.Parameter(w.to(dt))
            opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.01, **kw)
            for g in grads:
                p.grad = g.to(dt)
                opt.step()
            return p.detach().double()

        exact = stepped(torch.float64)
        err = {k: float(((stepped(dtype, **kw) - exact).abs() / exact.abs().clamp_min(1e-3)).nan_to_num(1e9).max())
               for k, kw in (("fused", kernel([torch.nn.Parameter(w)])), ("default", {"foreach": False}))}
        assert err["fused"] <= err["default"], (dtype, err)


def test_the_fused_step_equals_the_single_tensor_step_to_rounding(tmp_path):
    """Same mathematics as torch's CPU default, another order of float operations: equal to a few ulps."""
    prep = _prep(tmp_path)
    a, b = _state(prep), _state(prep)
    b.optimizer = torch.optim.AdamW(list(b.model.parameters()), lr=prep.c.train.lr,
                                    weight_decay=prep.c.train.weight_decay, foreach=False)
    b.scheduler = type(a.scheduler)(b.optimizer, a.scheduler.lr_lambdas[0])
    for _ in range(3):
        _update(prep, a), _update(prep, b)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_other_tensors_and_devices_keep_torch_default():
    p = torch.nn.Parameter(torch.zeros(3))
    assert kernel([p]) == {"fused": True}
    assert kernel([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]) == {"fused": True}
    assert kernel([]) == {}
    # the estimator's fake CUDA trace: parameters on the host standing for CUDA ones get CUDA's default, foreach
    assert kernel([p], "cuda") == {"foreach": True}
    # standing for FSDP's DTensor shards: torch's default for them, foreach on CUDA, one tensor at a time on CPU
    assert kernel([p], "cuda", sharded=True) == {"foreach": True}
    assert kernel([p], "cpu", sharded=True) == {"foreach": False}

    class Wrapped(torch.Tensor):  # a tensor subclass (as DTensor is) is left to torch's default
        pass

    assert kernel([torch.nn.Parameter(torch.zeros(3).as_subclass(Wrapped))]) == {}
    if torch.cuda.is_available():
        assert kernel([torch.nn.Parameter(torch.zeros(3, device="cuda"))]) == {}


def test_a_checkpoint_written_with_another_kernel_loads_keeping_this_runs(tmp_path):
    prep = _prep(tmp_path)
    a = _state(prep)
    _update(prep, a)
    for group in a.optimizer.param_groups:  # as written by a run on CUDA, or by a pilotrun before the fused kernel
        group["fused"], group["foreach"] = None, True
    ckpt = save_state(a, tmp_path / "ckpt")
    b = _state(prep, seed=1)
    assert "optimizer" in load_state(b, ckpt)
    assert all(g["fused"] is True and not g["foreach"] for g in b.optimizer.param_groups)
    assert _update(prep, b)["finite"]


def test_the_cpu_estimate_traces_the_fused_kernel_and_the_cuda_one_foreach(tmp_path):
    """Fused has no per-parameter temporaries; the foreach kernels' are on CUDA's rows, and the single-tensor
    loop's on CPU under FSDP over 2 ranks (torch steps DTensor shards one at a time there, as the run does)."""
    from pilotrun.rehearsal.memory.estimate import estimate

    def first_step(path, device):
        return {r["phase"]: r for r in estimate(load_campaign(path), device=device).data["phases"]}["first_step"]

    plain = tiny_causal_campaign(tmp_path / "plain", simple_records(12))
    fsdp = tiny_causal_campaign(tmp_path / "fsdp", simple_records(12), train__strategy="fsdp", train__nproc=2)
    assert first_step(plain, "cpu")["temporaries"] == 0
    assert first_step(plain, "cuda")["temporaries"] > 0
    assert first_step(fsdp, "cpu")["temporaries"] > 0
