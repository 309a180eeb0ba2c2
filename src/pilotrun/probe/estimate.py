"""Memory accounting without memory: fake tensors and a ledger of every storage they would allocate.

``fake_build(prep, dtype)`` builds the campaign's model through ``task.build_model()`` inside a
``FakeTensorMode`` (shapes and dtypes, no bytes). ``Accountant`` is a dispatch mode that sits above
the fake mode and books each new storage an op returns: its bytes (rounded the way the target
device's allocator rounds), when it was born and died, and what it is (parameters, gradients,
optimizer state, activations, temporaries). The loop's own functions then run under both modes, so
the estimate is the loop's computation, not a formula.

What the ledger knows about the target device:
- CUDA: each block is rounded up to 512 B (the caching allocator's minimum) and the ledger keeps every birth and
  death in order, with where each thread first called cuBLAS (``cublas``): probe/stream.py replays them through the
  caching allocator (probe/allocator.py) for the reserved bytes, cuBLAS's workspaces included. The CUDA context
  (about 0.5-0.75 GiB per process) and NCCL's buffers live outside the allocator and are not counted here.
- CPU: the bytes of the tensors; RSS adds the interpreter and libraries (the pilot's baseline).
"""

from __future__ import annotations

import contextlib
import math
import weakref

from pilotrun.errors import BadInput
from pilotrun.engine.optim import PAGED_MIN_NUMEL
from pilotrun import jsonsafe
from pilotrun.probe.fake_ops import inner_temporaries, stand_in
from pilotrun.tasks import make_task
from pilotrun.tasks.base import BUILTIN_TASKS
from pilotrun.tasks.loading import architecture_only, check_model_dir, torch_dtype

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
MIN_BLOCK = 512
# the most elements of an integer or boolean tensor whose values the trace carries (``Accountant.values``): a batch's
# ids, masks and labels and what is computed from them alone, not a (batch, 1, L, L) mask of a long sequence
CARRIED_NUMEL = 1 << 20


def _ceil(n: int, k: int) -> int:
    return -(-n // k) * k


STAGES = ("forward", "backward", "optimizer")


def _first_max(values, mask) -> int:
    """The index of the first highest of ``values`` where ``mask`` holds."""
    import numpy as np

    at = np.flatnonzero(mask)
    return int(at[values[at].argmax()])


class _Block:
    __slots__ = ("nbytes", "category", "born", "died", "in_optimizer")

    def __init__(self, nbytes: int, category: str, born: int, in_optimizer: bool = False):
        self.nbytes, self.category, self.born, self.died = nbytes, category, born, math.inf
        self.in_optimizer = in_optimizer


def _dispatch_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class Accountant:
    """Books storages; use ``with acc.tracking():`` around code that runs on fake tensors."""

    def __init__(self, device_kind: str = "cuda"):
        self.cuda = device_kind == "cuda"
        self.blocks: list[_Block] = []
        self.timeline: list[int] = [0]       # live bytes after each event
        self.stages: list[str] = ["forward"]  # what the loop was doing at each event (STAGES)
        self._known = None                   # storage -> (block, weakref), weakly keyed
        self.in_optimizer = False
        self.marks: dict[str, tuple[int, int]] = {}
        self._retags = 0                     # category changes: a kept ``_phase`` is stale after one
        self._paused = False                 # ``paused``: ops pass through unbooked
        self._phases: dict = {}
        # the values of the integer and boolean tensors computed from the data alone (``_carry``): fake tensor -> the
        # real one, so a question the run asks of its inputs (``.item()``: is any token padded?) gets the run's answer
        self.values = None
        # the event after which each thread first called cuBLAS ("forward": the main thread; "backward": autograd's
        # device thread): where the run allocates that thread's cuBLAS workspace (probe/stream.py puts it there)
        self.cublas: dict[str, int] = {}

    # --- kept: what ``summary`` reads, as plain data (a trace kept in the journal's home) ----------------
    def state(self) -> dict:
        return {"cuda": self.cuda, "timeline": self.timeline, "stages": self.stages,
                "marks": {k: list(v) for k, v in self.marks.items()}, "cublas": self.cublas,
                "blocks": [[b.nbytes, b.category, b.born, None if b.died == math.inf else b.died, b.in_optimizer]
                           for b in self.blocks]}

    @classmethod
    def from_state(cls, state: dict) -> "Accountant":
        acc = cls("cuda" if state["cuda"] else "cpu")
        acc.timeline, acc.stages = state["timeline"], state["stages"]
        acc.marks = {k: (v[0], v[1]) for k, v in state["marks"].items()}
        acc.cublas = dict(state.get("cublas") or {})
        for nbytes, category, born, died, in_optimizer in state["blocks"]:
            b = _Block(nbytes, category, born, in_optimizer)
            b.died = math.inf if died is None else died
            acc.blocks.append(b)
        return acc

    # --- booking ----------------------------------------------------------------------------------
    def _round(self, nbytes: int) -> int:
        return _ceil(nbytes, MIN_BLOCK) if (self.cuda and nbytes > 0) else nbytes

    def _event(self, delta: int, stage: str | None = None) -> int:
        self.timeline.append(self.timeline[-1] + delta)
        self.stages.append(stage or self._stage())
        return len(self.timeline) - 1

    def _stage(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        import torch

        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

    def allocate(self, nbytes: int, category: str) -> _Block:
        """A block that is no tensor of the trace (DDP buckets, a merged copy); free it with ``release``."""
        nbytes = self._round(int(nbytes))
        block = _Block(nbytes, category, 0, self.in_optimizer)
        block.born = self._event(nbytes)
        self.blocks.append(block)
        return block

    def release(self, block: _Block, stage: str | None = None) -> None:
        if block.died == math.inf:
            block.died = self._event(-block.nbytes, stage)

    # --- replay: a phase whose events are another's, booked again without dispatching an op ---------------
    def _events(self, name: str) -> list[tuple[str, _Block]]:
        """The marked phase's events in order: ("+", block) at a birth, ("-", block) at a death."""
        start, end = self.marks[name]
        at: dict[int, tuple[str, _Block]] = {}
        for b in self.blocks:
            if start < b.born <= end:
                at[b.born] = ("+", b)
            if start < b.died <= end:
                at[b.died] = ("-", b)
        return [at[i] for i in range(start + 1, end + 1)]

    def replayable(self, name: str, kept: str | None = None) -> bool:
        """Whether the marked phase ``name`` is closed but for its ``kept`` births: every block it allocated
        died inside it unless its category is ``kept`` (what the phase leaves behind for the next: the optimizer
        state of a first update), and no block allocated before it died inside it."""
        start, end = self.marks[name]
        return all((b.died <= end or b.category == kept) if kind == "+" else b.born > start
                   for kind, b in self._events(name))

    def recorded(self, name: str, kept: str | None = None) -> list[tuple]:
        """The events of a marked phase that ``replayable`` passed, as plain data in order: ("+", bytes, category,
        in_optimizer, stage) at a birth, less the births of category ``kept`` that outlive the phase; ("-", i,
        stage) at the death of the phase's i-th booked birth."""
        start, end = self.marks[name]
        out: list[tuple] = []
        index: dict[int, int] = {}
        for i, (kind, b) in enumerate(self._events(name), start + 1):
            if kind == "-":
                out.append(("-", index[id(b)], self.stages[i]))
            elif b.category != kept or b.died <= end:
                index[id(b)] = len(index)
                out.append(("+", b.nbytes, b.category, b.in_optimizer, self.stages[i]))
        return out

    def replay(self, events: list[tuple]) -> None:
        """Book ``recorded`` events again, in order, at their sizes, categories and stages, without an op: the
        ledger a second run of the same code on the same shapes writes (the callers say when that holds)."""
        born: list[_Block] = []
        for event in events:
            if event[0] == "-":
                self.release(born[event[1]], event[2])
                continue
            _, nbytes, category, in_optimizer, stage = event
            block = _Block(nbytes, category, 0, in_optimizer)
            block.born = self._event(nbytes, stage)
            self.blocks.append(block)
            born.append(block)

    def book(self, tensor, category: str, *, retag: bool = False) -> None:
        """Book the tensor's storage if new; with ``retag`` also say what an already booked one is."""
        from torch.utils.weak import WeakIdKeyDictionary

        if self._known is None:
            self._known = WeakIdKeyDictionary()
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        hit = self._known.get(storage)
        if hit is not None:
            if retag and hit[0].category != category:
                hit[0].category = category
                self._retags += 1
            return
        block = self.allocate(storage.nbytes(), category)
        self._known[storage] = (block, weakref.ref(storage, lambda _r, b=block: self.release(b)))

    def off_device(self, tensor) -> None:
        """A booked storage that the device's allocator never held (bitsandbytes' paged optimizer state, in CUDA
        unified memory): its block weighs nothing from its birth on, so no summary counts it."""
        storage = tensor.untyped_storage()
        hit = self._known.get(storage) if self._known is not None else None
        if hit is not None and hit[0].nbytes:
            hit[0].nbytes = 0
            self._retags += 1

    # --- phases -----------------------------------------------------------------------------------
    def mark(self, name: str):
        acc = self

        class _Mark:
            def __enter__(self):
                self.start = len(acc.timeline) - 1

            def __exit__(self, *exc):
                acc.marks[name] = (self.start, len(acc.timeline) - 1)
                return False

        return _Mark()

    def _phase(self, start: int, end: int, by_stage: bool):
        """The live bytes per category (``summary``'s keys) after each event of a phase, as int64 rows, the
        stage of each event as a code and the stages in the order they first came; kept per phase until the
        ledger changes (an event or a retag), so
        ``rows_for``'s many weightings of one trace share them."""
        import numpy as np

        stamp = (len(self.timeline), self._retags)
        if self._phases.get("stamp") != stamp:
            self._phases = {"stamp": stamp}
        key = (start, end, by_stage)
        if key in self._phases:
            return self._phases[key]
        keys = CATEGORIES + ("optimizer_temporaries",)
        n = end - start + 1
        delta = np.zeros((len(keys), n + 1), dtype=np.int64)
        for b in self.blocks:
            if b.born <= end and b.died > start:
                c = keys.index("optimizer_temporaries" if (b.category == "temporaries" and b.in_optimizer)
                               else b.category)
                delta[c, max(b.born, start) - start] += b.nbytes
                if b.died <= end:
                    delta[c, b.died - start] -= b.nbytes
        live = np.cumsum(delta[:, :n], axis=1)
        stages = self.stages[start: end + 1] if by_stage else ["all"] * n
        order = list(dict.fromkeys(stages))
        codes = np.array([order.index(x) for x in stages]) if len(order) > 1 else np.zeros(n, dtype=np.int64)
        self._phases[key] = (live, codes, order)
        return self._phases[key]

    def summary(self, name: str, scale: dict | None = None, *, by_stage: bool = False) -> dict:
        """Counters of a marked phase: baseline, peak, end, reserved, and what the peak is made of.

        ``scale`` weighs categories (FSDP: parameters, gradients and optimizer state × 1/ranks; the key
        ``optimizer_temporaries`` weighs the temporaries the optimizer step makes, which FSDP shards too);
        the peak is then the peak of the weighted sum, which can fall at another moment than the
        unweighted. ``by_stage`` adds ``stages``: the same peak and parts at the highest moment of each
        stage (forward, backward, optimizer), so a caller can follow each one as the model grows."""
        start, end = self.marks[name]
        keys = CATEGORIES + ("optimizer_temporaries",)
        live, codes, order = self._phase(start, end, by_stage)
        scale = dict(scale or {})
        scale.setdefault("optimizer_temporaries", scale.get("temporaries", 1.0))
        weight = {c: scale.get(c, 1.0) for c in keys}
        total = sum(live[j] * weight[c] for j, c in enumerate(keys))  # the same float sum, term by term
        totals = total.astype("int64") if total.dtype.kind == "f" else total
        best: dict[str, tuple[int, dict]] = {}
        for code, stage in enumerate(order):  # each stage's first highest moment, in the order they came
            at = _first_max(totals, codes == code) if len(order) > 1 else int(totals.argmax())
            parts = {c: int(int(live[j][at]) * weight[c]) for j, c in enumerate(CATEGORIES)}
            parts["temporaries"] += int(int(live[-1][at]) * weight["optimizer_temporaries"])
            best[stage] = (int(totals[at]), parts)
        top, top_parts = max(best.values(), key=lambda v: v[0])
        # reserved is the caching allocator's replay of the whole ledger (probe/stream.py), not a phase's sum
        out = {"baseline": int(totals[0]), "peak_allocated": top, "end_allocated": int(totals[-1]),
               "peak_reserved": None, "end_reserved": None, **top_parts}
        if by_stage:
            out["stages"] = {k: {"peak_allocated": v[0], **v[1]} for k, v in best.items()}
        return out

    @contextlib.contextmanager
    def paused(self):
        """Inside, ops pass through ``tracking`` as if it were not there (a model built mid-trace, booked later)."""
        self._paused = True
        try:
            yield self
        finally:
            self._paused = False

    # --- the dispatch mode ------------------------------------------------------------------------
    @contextlib.contextmanager
    def tracking(self, model=None):
        """Book every storage ops return; gradients and optimizer state are told apart by hooks."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        acc = self
        handles = []
        aten = torch.ops.aten
        # the ops that run through cuBLAS / cuBLASLt, whose first call on a thread allocates its workspace
        cublas_ops = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.addbmm, aten.mv, aten.addmv, aten.dot,
                      aten._addmm_activation, aten._scaled_mm, aten._int_mm,
                      *([aten._grouped_mm] if hasattr(aten, "_grouped_mm") else [])}

        def pre(opt, args, kwargs):
            acc.in_optimizer = True

        def post(opt, args, kwargs):
            acc.in_optimizer = False
            paged = acc.cuda and getattr(opt, "is_paged", False)
            for state in opt.state.values():
                for k, v in state.items():
                    if not isinstance(v, torch.Tensor):
                        continue
                    if paged and k in ("state1", "state2") and v.numel() >= PAGED_MIN_NUMEL:
                        acc.off_device(v)  # bitsandbytes' paged state: CUDA unified memory, not the allocator's
                    else:
                        acc.book(v, "optimizer_state", retag=True)

        handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        if model is not None:
            for p in model.parameters():
                if p.requires_grad:
                    handles.append(p.register_post_accumulate_grad_hook(
                        lambda q: acc.book(q.grad, "gradients", retag=True)))

        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.utils.weak import WeakIdKeyDictionary

        acc.values = WeakIdKeyDictionary()

        class Mode(_dispatch_base()):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if acc._paused:
                    return func(*args, **(kwargs or {}))
                if func is torch.ops.aten._local_scalar_dense.default:
                    real = acc.values.get(args[0])
                    if real is None:
                        return _placeholder(args[0])
                    with unset_fake_temporarily():
                        return real.item()
                inner = [acc.allocate(n, "temporaries") for n in inner_temporaries(func, args, kwargs or {}, acc.cuda)]
                out = stand_in(func, args, kwargs or {}, acc.cuda)  # a meta kernel narrower than the device's
                if out is None:
                    out = func(*args, **(kwargs or {}))
                    _carry(acc.values, func, args, kwargs or {}, out)
                backward = torch._C._current_graph_task_id() != -1
                if acc.in_optimizer or backward:
                    category = "temporaries"
                else:
                    category = "activations"
                for t in _tensors(out):
                    acc.book(t, category)
                for block in inner:  # the kernel's own temporaries, freed as it returns
                    acc.release(block)
                if func.overloadpacket in cublas_ops:
                    acc.cublas.setdefault("backward" if backward else "forward", len(acc.timeline) - 1)
                return out

        try:
            with Mode(), _eager_mask_decisions(acc.values):
                yield self
        finally:
            acc.values = None
            for h in handles:
                h.remove()


def _carry(values, func, args, kwargs: dict, out) -> None:
    """Carry the values of integer and boolean results whose inputs are all known (real tensors the code made from the
    data, a factory's output, or carried ones; at most ``CARRIED_NUMEL`` elements each): the op runs again on the real
    tensors, views and in-place writes included (a padding mask built row by row), outside the fake mode."""
    import torch
    from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
    from torch.utils._pytree import tree_flatten, tree_unflatten

    outs = _tensors(out)
    if not outs or any(t.is_floating_point() or t.is_complex() or t.numel() > CARRIED_NUMEL for t in outs):
        return
    flat, spec = tree_flatten((args, kwargs))
    real = []
    for a in flat:
        if isinstance(a, torch.Tensor) and is_fake(a):
            a = values.get(a)
            if a is None:
                return
        elif isinstance(a, torch.Tensor) and (a.is_floating_point() or a.numel() > CARRIED_NUMEL):
            return
        real.append(a)
    rargs, rkwargs = tree_unflatten(real, spec)
    try:
        with unset_fake_temporarily():
            got = func(*rargs, **rkwargs)
    except Exception:  # noqa: BLE001 - a value not carried is a value unknown: the question gets the placeholder
        return
    for fake, r in zip(outs, _tensors(got)):
        if is_fake(fake):
            values[fake] = r


@contextlib.contextmanager
def _eager_mask_decisions(values):
    """Inside, transformers decides the attention mask as the run does. Its masking_utils takes a fake tensor for a graph
    being traced (``is_tracing``) and then never skips the causal mask, where the run, eager, reads the padding mask
    and skips it for a batch without padding (SDPA's ``is_causal``): one (batch, 1, L, L) mask per layer held for the
    backward that the run never makes (on the H200, 64 MiB of wider1024's 3160 MiB step). A fake tensor whose values
    are carried (``_carry``: the batch's mask is) is read as the run reads it; one whose values are unknown is still
    taken for a traced one (the mask kept: the larger case)."""
    import sys

    import torch

    module = sys.modules.get("transformers.masking_utils")
    original = getattr(module, "is_tracing", None)
    if original is None:
        yield
        return

    def is_tracing(tensor=None):
        return original(None if isinstance(tensor, torch.Tensor) and tensor in values else tensor)

    module.is_tracing = is_tracing
    try:
        yield
    finally:
        module.is_tracing = original


def _tensors(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def _placeholder(t):
    """A value for ``.item()`` on a fake tensor whose value the trace does not carry (``_carry`` answers the data's own
    questions, e.g. "no padding anywhere?", with the run's answer). Memory depends on shapes, not on values, so any value
    the loop accepts will do: 1 for counts (an update needs targets), 0.0 for losses and norms (finite,
    and the grad scaler finds no inf, so the optimizer step runs and allocates its state), False for
    other flags (the larger, safer case where one keeps a tensor).
    Scalars fake mode still knows (the optimizer's step count) answer with their value."""
    import torch

    known = getattr(t, "constant", None)
    if known is not None:
        return known.item()
    if t.dtype == torch.bool:
        return False
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return 0.0
    return 1


# --- the model on fake tensors --------------------------------------------------------------------

@contextlib.contextmanager
def _default_dtype(dtype):
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _conversions_are_noops(allowed: set):
    """Inside fake mode ``module.to(...)`` cannot swap parameters. The model is built with its final
    dtype already the default, so the builder's own ``.to(dtype)`` steps on the way there (the
    campaign's dtype, then bf16 for bf16-true) change nothing in the end: answer them with the module
    itself, and refuse any other conversion."""
    import torch

    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        floats = {p.dtype for p in self.parameters() if p.is_floating_point()}
        if (device is None or device.type == "cpu") and (dtype is None or floats <= {dtype} or dtype in allowed):
            return self
        raise BadInput(f"the model's builder converts it to {dtype or device} after building, which fake tensors "
                       "cannot do", where="estimate",
                       fix="build the model in its dtype (torch.set_default_dtype) or measure with `pilotrun pilot`")

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


@contextlib.contextmanager
def _fake_deepcopies():
    """``copy.deepcopy`` of a fake tensor reads its data pointer (torch's ``Tensor.__deepcopy__``), which a fake
    tensor does not have: undefined behaviour that corrupted the heap ("free(): invalid next size") when PEFT
    copied a classifier head into ``modules_to_save`` under fake mode. Inside the build, a fake tensor's deep
    copy is a fake clone (same shape, dtype and requires_grad: the bytes a real copy would hold)."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    original = torch.Tensor.__deepcopy__

    def deepcopy(self, memo):
        if not is_fake(self):
            return original(self, memo)
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():  # a Parameter never comes here: nn.Parameter has its own __deepcopy__ (a clone)
            new = self.clone().requires_grad_(self.requires_grad)
        memo[id(self)] = new
        return new

    torch.Tensor.__deepcopy__ = deepcopy
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__ = original


def architecture_config(loaded) -> dict | None:
    """The model's config as a dict (model.config, or model.path's config.json) for a built-in task, else None:
    what the counted path reads the depth from."""
    from pathlib import Path

    c = loaded.campaign
    if c.task not in BUILTIN_TASKS:
        return None
    if not c.model.path:
        return dict(c.model.config) if isinstance(c.model.config, dict) else None

    path = Path(c.model.path)
    check_model_dir(path, weights=False)  # the architecture is all the estimate needs
    return jsonsafe.loads((path / "config.json").read_text(encoding="utf-8"))


def fake_build(loaded, fake_mode, overrides: dict | None = None):
    """The campaign's model on fake tensors, built by ``task.build_model()`` in its dtype: the builder pilot
    and train use (``tasks.loading.architecture_only``: the same config, no weights read), with
    ``overrides`` (a depth) in the config's keys."""
    import torch

    c = loaded.campaign
    dtype = torch.bfloat16 if c.train.precision == "bf16-true" else torch_dtype(c.model.dtype)
    task = make_task(loaded, shared_tokenizer=True)  # it builds, never tokenizes
    allowed = {dtype, torch_dtype(c.model.dtype)}
    q = c.model.quantization
    if q is not None and q.bits == 4:  # peft moves LoRA to a 4-bit layer's compute dtype, then back to float32
        allowed.add(torch_dtype(q.compute_dtype))
    with fake_mode, _default_dtype(dtype), _conversions_are_noops(allowed), \
            _fake_deepcopies(), architecture_only(overrides):
        model = task.build_model()
    return model


def unsharded_block_bytes(model) -> int:
    """Bytes of the largest module FSDP shards as a unit (HF's ``_no_split_modules``): what one all-gather holds."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    best = 0
    for m in model.modules():
        if type(m).__name__ in names:
            best = max(best, sum(p.numel() * p.element_size() for p in m.parameters()))
    return best


def root_bytes(model) -> int:
    """Bytes of the parameters outside every module FSDP shards as a unit: the root's (embeddings, the head, the
    final norm), which FSDP2 gathers at the root's forward and keeps unsharded through the backward."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    inside = {id(p) for m in model.modules() if type(m).__name__ in names for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in inside)
