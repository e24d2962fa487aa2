"""CUDA tier for the runtime (skipped without a GPU): gradients, memory, stream safety."""

from __future__ import annotations

import pytest
import torch

import offrecomp
from offrecomp import _torch_compat as tc
from tests import models
from tests.helpers import assert_bitwise, train, twin

pytestmark = pytest.mark.cuda

MODES = ["keep", "recompute", "offload", "auto"]


def _gpt(layers: int = 4, h: int = 256, p: float = 0.1) -> torch.nn.Module:
    torch.manual_seed(0)
    return models.GPT(layers=layers, h=h, heads=8, vocab=512, p=p).cuda()


def _batch(seed: int, seq: int = 512) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 512, (4, seq), device="cuda", generator=g)


def _grads(model: torch.nn.Module, ctx: object = None, steps: int = 3) -> list[torch.Tensor]:
    import contextlib

    out: list[torch.Tensor] = []
    with ctx if ctx is not None else contextlib.nullcontext():
        for step in range(steps):
            torch.manual_seed(step)
            model(_batch(step)).backward()
            out += [p.grad.detach().clone() for p in model.parameters()]
            model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_plain_on_cuda(mode: str) -> None:
    model = _gpt()
    ref1 = _grads(twin(model))
    ref2 = _grads(twin(model))
    deterministic = all(torch.equal(a, b) for a, b in zip(ref1, ref2))
    m = twin(model)
    got = _grads(m, offrecomp.runtime(m, mode=mode, min_bytes=0, budget="50%"))
    for a, b in zip(ref1, got):
        if deterministic:
            assert torch.equal(a, b)
        else:  # the plain run itself is not bitwise reproducible (atomics in attention backward)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_offload_with_delayed_compute_stream_stays_correct() -> None:
    """Delay the compute stream right before every save, so copies race the producers
    unless every ordering edge exists."""
    model = _gpt(layers=3, h=256, p=0.0)
    ref = _grads(twin(model), steps=2)
    deterministic = all(torch.equal(a, b) for a, b in zip(ref, _grads(twin(model), steps=2)))
    m = twin(model)
    for blk in m.blocks:
        orig = blk.fc1.forward

        def slow(x: torch.Tensor, _orig=orig) -> torch.Tensor:  # type: ignore[no-untyped-def]
            tc.cuda_sleep(2_000_000)  # ~1 ms of busy wait on the compute stream
            return _orig(x)

        blk.fc1.forward = slow
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    got = _grads(m, rt, steps=2)
    steps = rt.report().steps
    assert len(steps) == 2 and all(s.offloaded_bytes > 0 for s in steps), steps  # the copies ran
    assert len(got) == len(ref)
    for a, b in zip(ref, got):
        if deterministic:
            assert torch.equal(a, b)
        else:  # the plain run itself is not bitwise reproducible (atomics in attention backward)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.serve_held
def test_offload_serves_groups_whose_late_copies_still_hold_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each group's D2H copy starts late (a sleep on the D2H stream before it), so its
    sources are still held when backward reaches it: served, not reloaded (NOTE [Served
    groups] in offrecomp/transfer.py), with the sources let go of after their copies;
    gradients as plain's, and the peak no more than keep's."""
    from offrecomp.backends import CudaBackend

    copy_many = CudaBackend.copy_many

    def late(self: CudaBackend, dsts: list[torch.Tensor], srcs: list[torch.Tensor], stream: torch.cuda.Stream) -> None:
        if dsts and dsts[0].device.type == "cpu":  # a D2H copy
            with torch.cuda.stream(stream):
                tc.cuda_sleep(20_000_000)  # ~10 ms
        copy_many(self, dsts, srcs, stream)

    monkeypatch.setattr(CudaBackend, "copy_many", late)
    model = _gpt(layers=3, h=256, p=0.0)
    ref = _grads(twin(model), steps=2)
    deterministic = all(torch.equal(a, b) for a, b in zip(ref, _grads(twin(model), steps=2)))
    peaks = {}
    for mode in ("keep", "offload"):
        m = twin(model)
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
        got = _grads(m, rt, steps=2)
        for a, b in zip(ref, got):
            if deterministic:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        steps = rt.report().steps
        peaks[mode] = max(s.peak_activation_bytes for s in steps)
    assert all(s.served_groups > 0 for s in steps), [s.served_groups for s in steps]
    assert peaks["offload"] <= peaks["keep"] * 1.01, peaks


def test_offload_and_recompute_hold_little_after_forward() -> None:
    """What forward leaves on the device for backward, measured by the allocator."""
    model = _gpt(layers=6, h=512, p=0.0)
    held, peaks = {}, {}
    for mode in ("keep", "offload", "recompute"):
        m = twin(model)
        with offrecomp.runtime(m, mode=mode, min_bytes=1 << 20):
            m(_batch(0, 1024)).backward()  # warm-up: pool, grads
            m.zero_grad(set_to_none=False)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss = m(_batch(1, 1024))
            torch.cuda.synchronize()
            held[mode] = torch.cuda.memory_allocated() - base
            loss.backward()
            torch.cuda.synchronize()
            peaks[mode] = torch.cuda.max_memory_allocated() - base
            del loss
        del m
        torch.cuda.empty_cache()
    # forced offload: the engine holds the sources of copies in flight up to its window
    # (256 MiB) plus the newest group, at most a block's saves (NOTE [Source lifetime]
    # in offload.py); small saves stay
    assert held["offload"] < (256 << 20) + held["keep"] / 6, held
    assert held["recompute"] < 0.35 * held["keep"], held
    assert peaks["offload"] < peaks["keep"] and peaks["recompute"] < peaks["keep"], peaks


def test_auto_peak_within_budget_on_cuda() -> None:
    model = _gpt(layers=6, h=512, p=0.0)
    probe = twin(model)
    with offrecomp.runtime(probe, mode="keep", min_bytes=1 << 20) as rt:
        probe(_batch(0, 1024)).backward()
    keep_bytes = rt.report().steps[0].peak_activation_bytes
    del probe
    budget = keep_bytes // 2
    m = twin(model)
    # a pinned replay cost: no re-plan between the two planned steps (checked below)
    with offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=1 << 20, replay_op_us=25) as rt:
        for step in range(4):
            m(_batch(step, 1024)).backward()
            m.zero_grad(set_to_none=True)
    steps = rt.report().steps
    last = steps[-1]
    assert last.phase == "planned"
    assert last.peak_activation_bytes <= budget * 1.05
    assert last.device_peak_bytes is not None
    # the planner's breakdown is filled on the device too
    assert last.predicted_forward_seconds is not None and last.forward_seconds > 0
    assert last.predicted_stall_seconds is not None
    planned = [s for s in steps if s.phase == "planned"]
    if any(s.offloaded_bytes for s in planned):
        # pinned when the plan was solved: planned steps pin nothing more
        assert len({s.pool_reserved_bytes for s in planned if s.offloaded_bytes}) == 1


@pytest.mark.parametrize("mode", ["recompute", "offload", "auto"])
def test_mixed_device_saves_in_one_region(mode: str) -> None:
    """A block that saves CPU and CUDA tensors: CPU ones are placed on the emulated path
    or kept, CUDA ones on the CUDA path; gradients match."""

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            side = (x.detach().cpu() * 2).requires_grad_(False)
            w = torch.tanh(torch.randn(256, device="cpu") + side.mean())  # saved on CPU
            return torch.tanh(self.lin(x)) * w.to(x.device).mean()

    torch.manual_seed(0)
    model = torch.nn.Sequential(Mixed(), Mixed()).cuda()
    x = torch.randn(64, 256, device="cuda")

    def run(m: torch.nn.Module, steps: int = 4) -> list[list[torch.Tensor]]:
        out = []
        for step in range(steps):
            torch.manual_seed(step)
            m(x * (step + 1)).square().sum().backward()
            out.append([p.grad.clone() for p in m.parameters()])
            m.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return out

    ref = run(twin(model))
    deterministic = all(torch.equal(u, v) for a, b in zip(ref, run(twin(model))) for u, v in zip(a, b))
    m = twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    with rt:
        got = run(m)  # auto: measure, calibrate, then planned passes
    assert len(got) == len(ref)
    for a, b in zip(ref, got):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            if deterministic:  # a Linear and tanh's, no atomics: plain repeats itself bitwise
                assert torch.equal(u, v)
            else:
                torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)
    steps = rt.report().steps
    assert len(steps) == 4, steps
    if mode == "recompute":
        assert all(s.replays == 2 and s.recomputed_bytes > 0 for s in steps), steps
    elif mode == "offload":
        assert all(s.offloaded_bytes > 0 for s in steps), steps
    else:
        assert [s.phase for s in steps][:2] == ["measure", "calibrate"], steps
        assert steps[-1].phase == "planned", steps


def test_routed_blocks_that_vary_hold_the_budget_on_cuda() -> None:
    """NOTE [Regions that vary]: routed blocks (the rows a gate picks change every step)
    under auto at a budget between recompute's and keep's: once known to vary, their
    saves are dropped or offloaded by position on the device, the planned steps hold
    about the budget (the profile grows to the routing seen: NOTE [Sizes of regions
    that vary]), and gradients match plain bitwise."""
    from tests.offrecomp.test_budgets import _RoutedBlock

    torch.manual_seed(0)
    model = models.Stack([_RoutedBlock(256) for _ in range(4)]).cuda()

    def batch(s: int) -> torch.Tensor:
        g = torch.Generator(device="cuda").manual_seed(s)
        return torch.randn(8192, 256, device="cuda", generator=g)

    probe = twin(model)
    with offrecomp.runtime(probe, mode="keep", min_bytes=1 << 16) as rt:
        probe(batch(0)).backward()
    budget = rt.report().steps[0].peak_activation_bytes // 2
    del probe
    ref = train(twin(model), batch, steps=16)
    rt = offrecomp.runtime(model, budget=budget, min_bytes=1 << 16)
    got = train(model, batch, rt, steps=16)
    assert_bitwise(ref, got)
    assert all(r.variable for r in rt.planner.host.regions)
    planned = [s for s in rt.report().steps[-4:] if s.phase == "planned"]
    assert planned, [s.phase for s in rt.report().steps]
    for s in planned:
        assert s.recomputed_bytes + s.offloaded_bytes > 0, s
        assert s.peak_activation_bytes <= budget * 1.1, (s.peak_activation_bytes, budget)


class _Autocast(torch.nn.Module):
    """A model's forward under CUDA bf16 autocast, as the GPU benchmarks train."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.model(idx)


def test_offload_under_autocast_copies_views_and_permuted_saves_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Typed sources] on CUDA: under bf16 autocast a GPT block's saves include
    transposed weight casts, q/k/v parts of one projection and attention's output; they
    join their groups as aliases of their bases or with their own strides, and the D2H
    copies keep the storages' bytes: gradients as plain's."""
    from offrecomp.offload import OffloadEngine

    added = {"typed": 0, "strided": 0, "flat": 0}
    original = OffloadEngine.add

    def spy(self: OffloadEngine, group, source, nbytes, stride=None):  # type: ignore[no-untyped-def]
        typed = isinstance(source, torch.Tensor)  # else the storage: a flat slot
        added["flat" if not typed else "strided" if stride is not None else "typed"] += 1
        return original(self, group, source, nbytes, stride)

    model = _Autocast(_gpt(p=0.0))
    ref1 = _grads(twin(model))
    ref2 = _grads(twin(model))
    deterministic = all(torch.equal(a, b) for a, b in zip(ref1, ref2))
    monkeypatch.setattr(OffloadEngine, "add", spy)
    m = twin(model)
    got = _grads(m, offrecomp.runtime(m, mode="offload", min_bytes=0))
    for a, b in zip(ref1, got):
        if deterministic:
            assert torch.equal(a, b)
        else:  # the plain run itself is not bitwise reproducible (atomics in attention backward)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert added["typed"] > 0, added  # the flat count is informative: a GPT block made none on the CPU
