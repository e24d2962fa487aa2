"""Invariant 4: leaving the context by exception removes every hook; the next step is right."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from tests.helpers import assert_bitwise, make, train, twin


class Boom(Exception):
    pass


class Exploding(nn.Module):
    """Wraps a model; raises in forward (inside block 1) or in backward when armed."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.arm: str | None = None
        blk = inner.blocks[1]
        orig = blk.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            y = orig(x)
            if self.arm == "forward":
                raise Boom("in forward")
            if self.arm == "interrupt":
                raise KeyboardInterrupt
            if self.arm == "backward":
                y.register_hook(self._explode)
            return y

        blk.forward = forward

    @staticmethod
    def _explode(grad: torch.Tensor) -> torch.Tensor:
        raise Boom("in backward")

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.inner(idx)


@pytest.mark.parametrize("where", ["forward", "backward", "interrupt"])
@pytest.mark.parametrize("mode", ["recompute", "offload", "keep", "auto"])
def test_exception_removes_hooks_and_next_step_is_correct(where: str, mode: str) -> None:
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = Exploding(twin(model))
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    m.arm = where
    exc_type = KeyboardInterrupt if where == "interrupt" else Boom
    loss = None
    with pytest.raises(exc_type), rt:
        loss = m(batch(0))
        loss.backward()
    assert tc.top_saved_tensors_hooks() is None
    if mode == "offload" and loss is not None:  # the graph `loss` holds keeps its offloaded storages
        assert rt.offload_engine is not None and rt.offload_groups_held > 0
    else:  # nothing offloaded is alive: the pool is freed at the exit
        assert rt.offload_engine is None and rt.offload_groups_held == 0
    del loss
    assert rt.offload_engine is None  # an exit by exception frees the pool once nothing needs it
    m.zero_grad(set_to_none=True)  # a backward that raised may have left partial grads
    m.arm = None
    got = train(m, batch, rt, steps=2)  # the same runtime, entered again
    assert_bitwise(ref, [{k.replace("inner.", ""): v for k, v in s.items()} for s in got])
    assert tc.top_saved_tensors_hooks() is None
    if mode == "offload":
        assert rt.offload_engine is not None  # a normal exit keeps the pinned pool for the next entry
    rt.close()
    assert rt.offload_engine is None


def test_graph_kept_past_exit_still_backprops() -> None:
    model, batch = make("gpt_dropout")
    ref_m = twin(model)
    torch.manual_seed(0)
    ref_m(batch(0)).backward()
    m = twin(model)
    with offrecomp.runtime(m, mode="offload", min_bytes=0) as rt:
        torch.manual_seed(0)
        loss = m(batch(0))
    assert tc.top_saved_tensors_hooks() is None
    rt.close()
    assert rt.offload_engine is not None  # offload groups still referenced by the graph
    loss.backward()
    del loss
    assert rt.offload_engine is None  # the last offload group closed it
    for (n, p), q in zip(ref_m.named_parameters(), m.parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_runtimes_must_not_nest() -> None:
    model, _ = make("gpt_dropout")
    a = offrecomp.runtime(model, mode="keep")
    b = offrecomp.runtime(twin(model), mode="keep")
    with a:
        with pytest.raises(RuntimeError, match=r"neither nest nor run side by side.*ModuleDict"), b:
            pass
        with pytest.raises(RuntimeError, match="already active"), a:
            pass
    assert tc.top_saved_tensors_hooks() is None


def test_disable_env_makes_runtime_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFRECOMP_DISABLE", "1")
    model, batch = make("gpt_dropout")
    rt = offrecomp.runtime(model, mode="recompute")  # the argument loses to DISABLE
    assert rt.config.disable and not rt.config.active
    with rt:
        assert tc.top_saved_tensors_hooks() is None
        assert "forward" not in model.blocks[0].__dict__
        model(batch(0)).backward()
    assert rt.report().steps == []


def test_mode_off_installs_nothing() -> None:
    model, batch = make("gpt_dropout")
    with offrecomp.runtime(model, mode="off") as rt:
        assert tc.top_saved_tensors_hooks() is None
        model(batch(0)).backward()
    assert rt.report().steps == []


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_copy_made_inside_the_runtime_is_a_plain_model(mode: str) -> None:
    """NOTE [Copies of a managed model]: a deep copy (an EMA or teacher made in the loop)
    runs its own forward with its own weights, during the runtime and after it; a model
    saved whole with torch.save loads and runs; signatures stay inspectable."""
    import copy
    import inspect
    import io

    model, batch = make("gpt_dropout")
    model.eval()  # no dropout: outputs comparable across calls
    x = batch(0)
    with offrecomp.runtime(model, mode=mode, min_bytes=0):
        model(x)
        ema = copy.deepcopy(model)
        with torch.no_grad():
            for p in ema.parameters():
                p.mul_(0.5)
        inside = ema(x)
        buf = io.BytesIO()
        torch.save(model, buf)
        assert "idx" in inspect.signature(model.forward).parameters
    plain = twin(ema)
    for blk in plain.modules():
        blk.__dict__.pop("forward", None)
    assert torch.equal(inside, plain(x))  # the copy's own weights, not the original's
    assert torch.equal(ema(x), plain(x))
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(x), model(x))


def test_a_wrapped_forward_reads_the_code_of_the_forward_it_wraps() -> None:
    """NOTE [Copies of a managed model]: the wrapper in a forward slot reads ``__code__``
    through to the forward it wraps, so ``torch.export`` of the model inside ``with rt:``
    (it reads ``forward.__code__``) exports what plain exports, and training goes on after
    it. It has no ``__func__``: accelerate's ``prepare`` would rebuild a forward that has
    one from the class's function, around the wrapper."""
    model, batch = make("gpt_dropout")
    model.eval()
    x = batch(0)
    ref = torch.export.export(model, (x,)).module()(x)
    with offrecomp.runtime(model, mode="recompute", min_bytes=0):
        model(x).backward()
        block = model.blocks[0]
        fwd: Any = block.forward
        assert fwd.__code__ is type(block).forward.__code__
        assert not hasattr(fwd, "__func__") and not hasattr(model.forward, "__func__")
        assert torch.equal(torch.export.export(model, (x,)).module()(x), ref)
        model(x).backward()
        with pytest.raises(AttributeError, match="no attribute 'nothing'"):
            fwd.nothing  # noqa: B018


class _InterruptedInReplay(nn.Module):
    """Raises KeyboardInterrupt from a ``finally`` of its forward during a replay: where a
    Ctrl-C lands while the replay's early stop unwinds the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.arm = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return x + self.fc2(torch.relu(self.fc1(x)))
        finally:
            if self.arm and offrecomp.in_replay():
                self.arm = False
                raise KeyboardInterrupt


def test_an_interrupt_during_a_replays_early_stop_reaches_the_loop() -> None:
    """A KeyboardInterrupt replacing the replay's private early-stop exception as it
    unwinds the forward goes on to the loop, not taken for the early stop."""
    torch.manual_seed(0)
    m = nn.Sequential(*[_InterruptedInReplay() for _ in range(3)])
    x = torch.randn(4, 16)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        m(x).square().mean().backward()
        for b in m:
            b.arm = True  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            m(x).square().mean().backward()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_inside_the_runtime_runs_plainly_and_may_enter_its_own() -> None:
    """NOTE [Runtimes across fork] (context.py): a child forked inside ``with rt:`` took
    the parent's runtime for active: its autograd went through the copy's hooks, and
    ``offrecomp.runtime(...)`` of its own was refused as a second runtime. The child's
    copy is taken out; the parent's runtime trains on bitwise."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="recompute")
    with rt:
        pid = os.fork()
        if pid == 0:  # the child: exit status only, never back into pytest
            code = 3
            try:
                plain = tc.top_saved_tensors_hooks() is None and all("forward" not in v.__dict__ for v in m.modules())
                own, child_batch = make("gpt_dropout")
                want = train(twin(own), child_batch, steps=1)
                got = train(own, child_batch, offrecomp.runtime(own, mode="recompute"), steps=1)
                same = all(torch.equal(want[0][k], got[0][k]) for k in want[0])
                code = 0 if plain and same else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert_bitwise(ref, train(m, batch, rt, steps=2))


def test_data_parallel_over_several_devices_is_refused() -> None:
    """NOTE [Copies of a managed model]: its replicas, shallow copies run on threads of
    its own, would run the original modules through the runtime's wrappers. Over one
    device (or none) it calls the module itself, and is taken."""
    model, _ = make("gpt_dropout")
    dp = nn.DataParallel(model)
    dp.device_ids = [0, 1]  # as on a machine with two GPUs (the check reads only these)
    with pytest.raises(ValueError, match=r"is an nn.DataParallel over devices \[0, 1\].*DistributedDataParallel"):
        offrecomp.runtime(nn.ModuleDict({"dp": dp}))
    dp.device_ids = [0]
    offrecomp.runtime(dp)
    offrecomp.runtime(dp, mode="off")
