"""NOTE [Hooks a replay registers]: hooks a block registers in its forward (on first use,
or swapped at each call) are registered once, as in a plain run, however often the block
replays."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from tests.helpers import tight_budget, train, variant_runtime


class _LazyHooks(nn.Module):
    """Registers, on first use, a gradient hook on a parameter, a post-accumulate hook on
    another and a forward hook on a submodule; swaps a per-batch hook at each call,
    keeping its handle."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self.hooked = False
        self.handle: Any = None
        self.accumulated = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.hooked:
            self.fc1.weight.register_hook(lambda g: g * 0.5)
            self.fc2.bias.register_post_accumulate_grad_hook(self._count)
            self.fc2.register_forward_hook(lambda m, a, out: out * 1.5)
            self.hooked = True
        if self.handle is not None:
            self.handle.remove()
        s = float(x.detach().abs().mean())
        self.handle = self.fc2.weight.register_hook(lambda g: g / (1.0 + s))
        return x + self.fc2(F.gelu(self.fc1(x)))

    def _count(self, p: torch.Tensor) -> None:
        self.accumulated += 1


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_LazyHooks() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def _batch(s: int) -> torch.Tensor:
    return torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s))


def _hooks(m: nn.Module) -> list[int]:
    out = []
    for b in m.blocks:  # type: ignore[union-attr]
        out += [
            len(b.fc1.weight._backward_hooks or {}), len(b.fc2.weight._backward_hooks or {}),
            len(b.fc2.bias._post_accumulate_grad_hooks or {}), len(b.fc2._forward_hooks), b.accumulated,
        ]
    return out


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve", "offload"])
def test_hooks_a_forward_registers_are_not_registered_again_by_replays(variant: str) -> None:
    """Replays saw the guard attribute (and the swapped handle) as at the call's entry and
    registered the hooks again: the parameter's gradient went through both from step 0
    on (half of plain's), and the swapped hook piled up one per step."""
    torch.manual_seed(0)
    model = _Model()
    ref_model = copy.deepcopy(model)
    ref = train(ref_model, _batch, None, steps=6)
    budget = tight_budget(model, _batch) if variant.startswith("auto") else None
    m = copy.deepcopy(model)
    got = train(m, _batch, variant_runtime(m, variant, budget), steps=6)
    for r, g in zip(ref, got):
        assert r.keys() == g.keys() and all(torch.equal(r[k], g[k]) for k in r)
    assert _hooks(m) == _hooks(ref_model)


def _gelu_outputs_recomputed() -> offrecomp.Plan:
    """The plan that drops storage 2 (gelu's output) of each of three ``_Logged`` blocks
    and keeps the rest (``a + 1``): its serving replays hand ``l1``'s output a
    placeholder where nothing stops them."""
    return offrecomp.Plan(
        placements={(f"{b}", 0, 2): offrecomp.Placement.RECOMPUTE for b in range(3)},
        default=offrecomp.Placement.KEEP,
    )


class _Logged(nn.Module):
    """``l1``'s output is saved by no op: a serving replay that keeps ``a + 1`` and
    drops gelu's output hands a placeholder for it to ``l1``'s forward hooks."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.l2(F.gelu(self.l1(x) + 1.0))


@pytest.mark.parametrize("hooked_at", [0, 3])
def test_forward_hooks_are_never_handed_placeholders(hooked_at: int) -> None:
    """NOTE [Placeholders and hooks]: a feature store filled by forward hooks held
    uninitialized bytes after a serving replay (plain runs and checkpoint hold the
    layer's output); hooked before the recording (0) or after it (3)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Logged() for _ in range(3)])
    feats: dict[int, torch.Tensor] = {}

    def hook(i: int) -> Any:
        return lambda mod, inp, out: feats.__setitem__(i, out.detach())

    plan = _gelu_outputs_recomputed()
    served = []
    with offrecomp.runtime(model, mode="auto", min_bytes=0, replay_op_us=0) as rt:
        rt.set_plan(plan)
        for step in range(6):
            if step == hooked_at:
                for i, b in enumerate(model):
                    b.l1.register_forward_hook(hook(i))
            loss = model(_batch(step)[0]).square().mean()
            before = {k: v.clone() for k, v in feats.items()}
            loss.backward()
            assert before.keys() == feats.keys()
            assert all(torch.equal(before[k], feats[k]) for k in before), f"step {step}"
    served = [r.served_ops for r in rt.report().steps]
    assert sum(served) > 0  # the replays still serve what the plan keeps


@pytest.mark.parametrize("detach", [True, False])
def test_hooks_held_only_around_the_forward_are_never_handed_placeholders(detach: bool) -> None:
    """NOTE [Placeholders and hooks]: a feature hook the loop takes out before the backward
    runs in the replay (NOTE [Hooks a replay registers]); a serving replay judged by the
    hooks at backward, none, handed it a placeholder, and the feature store held
    uninitialized bytes (a hook keeping the output itself runs no op the recording
    lacks: nothing else would notice). Hooked from step 3, after the recording."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Logged() for _ in range(3)])
    feats: dict[int, torch.Tensor] = {}

    def hook(i: int) -> Any:
        return lambda mod, inp, out: feats.__setitem__(i, out.detach() if detach else out)

    plan = _gelu_outputs_recomputed()
    with offrecomp.runtime(model, mode="auto", min_bytes=0, replay_op_us=0) as rt:
        rt.set_plan(plan)
        for step in range(6):
            hooked = step >= 3  # after the recording
            handles = [b.l1.register_forward_hook(hook(i)) for i, b in enumerate(model) if hooked]
            loss = model(_batch(step)[0]).square().mean()
            for h in handles:
                h.remove()
            before = {k: v.clone() for k, v in feats.items()}
            loss.backward()
            assert all(torch.equal(before[k], feats[k]) for k in before), f"step {step}"
    assert sum(r.served_ops for r in rt.report().steps) > 0


class _SwapsThroughAList(nn.Module):
    """Swaps its gradient hook at each call, the handles in a list it empties in place:
    the list is the same object in a replay, which finds the forward's handle there."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self.handles: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.handles.append(self.fc1.weight.register_hook(lambda g: g * 0.5))
        return x + self.fc2(F.gelu(self.fc1(x)))


@pytest.mark.parametrize("variant", ["recompute", "auto_tight"])
def test_a_hook_swapped_through_a_list_stays_one(variant: str) -> None:
    """The replay removes the forward's hook and records its own in the list: removing
    the replay's, the backward ran with none (gradients doubled against plain's)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_SwapsThroughAList() for _ in range(3)])
    ref_model = copy.deepcopy(model)

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(_Scalar(ref_model), batch, None, steps=5)
    budget = tight_budget(_Scalar(model), batch) if variant == "auto_tight" else None
    m = copy.deepcopy(model)
    got = train(_Scalar(m), batch, variant_runtime(m, variant, budget), steps=5)
    for r, g in zip(ref, got):
        assert r.keys() == g.keys() and all(torch.equal(r[k], g[k]) for k in r)
    assert [len(b.fc1.weight._backward_hooks or {}) for b in m] == [1, 1, 1]


class _Scalar(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).square().mean()


def test_hooks_on_the_region_itself_leave_it_its_placeholders() -> None:
    """A replay calls the region's forward, not the module: hooks on the block itself
    (FSDP2's on a sharded block) see no tensor of the replay, and placeholders stay."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Logged() for _ in range(3)])
    for b in model:
        b.register_forward_hook(lambda mod, inp, out: None)
    plan = _gelu_outputs_recomputed()
    with offrecomp.runtime(model, mode="auto", min_bytes=0, replay_op_us=0) as rt:
        rt.set_plan(plan)
        for step in range(4):
            model(_batch(step)[0]).square().mean().backward()
    structures = [s for e in rt.planner.entries.values() for s in e.structures.values()]
    assert len(structures) == 3 and all(s.placeholders_ok for s in structures)
    assert sum(r.served_ops for r in rt.report().steps) > 0


class _ScalesOnFirstUse(nn.Module):
    """Registers, on first use, a forward hook on ``fc2`` that changes its output, and one
    on a sibling block's weight (``other``)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.hooked = False
        self.other: list[nn.Module] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.hooked:
            self.fc2.register_forward_hook(lambda m, a, out: out * 1.5)
            for o in self.other:
                o.fc1.weight.register_hook(lambda g: g * 0.5)  # type: ignore[union-attr]
            self.hooked = True
        return x + torch.tanh(self.fc2(F.gelu(self.fc1(x))))


class _BuildsOnFirstUse(nn.Module):
    """Builds a submodule on first use, from an attribute that was None."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.proj: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.proj is None:
            self.proj = nn.Linear(x.shape[-1], x.shape[-1])
        return x + torch.tanh(self.fc(F.gelu(self.proj(x))))


@pytest.mark.parametrize("variant", ["recompute", "auto_tight"])
def test_a_replay_sees_the_hooks_its_forward_found(variant: str) -> None:
    """The replay of the call that registered a forward hook ran with the forward's hook
    and its own (the output scaled twice: every gradient off), and a hook it registered on
    a sibling block's weight piled up."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_ScalesOnFirstUse() for _ in range(3)])
    model[0].other.append(model[2])
    ref_model = copy.deepcopy(model)
    ref_model[0].other[:] = [ref_model[2]]

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(_Scalar(ref_model), batch, None, steps=5)
    budget = tight_budget(_Scalar(model), batch) if variant == "auto_tight" else None
    m = copy.deepcopy(model)
    m[0].other[:] = [m[2]]
    got = train(_Scalar(m), batch, variant_runtime(m, variant, budget), steps=5)
    for r, g in zip(ref, got):
        assert r.keys() == g.keys() and all(torch.equal(r[k], g[k]) for k in r)
    assert [len(b.fc2._forward_hooks) for b in m] == [1, 1, 1]
    assert len(m[2].fc1.weight._backward_hooks or {}) == 1


@pytest.mark.parametrize("variant", ["recompute", "auto_tight"])
def test_a_submodule_built_on_first_use_is_the_forwards(variant: str) -> None:
    """The replay saw the attribute at its entry value (None) and built another module,
    which the model then held: the gradient went to the forward's, which it no longer
    held."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_BuildsOnFirstUse() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    m = copy.deepcopy(model)
    budget = tight_budget(_Scalar(model), batch) if variant == "auto_tight" else None
    with variant_runtime(m, variant, budget):
        for s in range(4):
            torch.manual_seed(100 + s)  # the same first-use initialisation in both runs
            _Scalar(m)(batch(s)).backward()
            for b in m:
                assert b.proj is not None and b.proj.weight.grad is not None  # the module the forward used
    ref = copy.deepcopy(model)
    for s in range(4):
        torch.manual_seed(100 + s)
        _Scalar(ref)(batch(s)).backward()
    for (n, a), b in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(a.grad, b.grad), n  # type: ignore[arg-type]


def test_a_hook_swapped_through_a_list_by_a_block_called_twice() -> None:
    """Each call's replay left the list naming its own hook: the first call's, replayed
    last, stood where plain keeps the second call's."""

    class ScaledByItsInput(_SwapsThroughAList):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for h in self.handles:
                h.remove()
            self.handles.clear()
            s = float(x.detach().abs().mean())
            self.handles.append(self.fc1.weight.register_hook(lambda g: g / (1.0 + s)))
            return x + self.fc2(F.gelu(self.fc1(x)))

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = ScaledByItsInput()
            self.other = ScaledByItsInput()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.other(self.block(self.block(x))).square().mean()

    torch.manual_seed(0)
    model = Twice()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, None, steps=4)
    m = copy.deepcopy(model)
    got = train(m, batch, offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=[ScaledByItsInput]), steps=4)
    for r, g in zip(ref, got):
        assert all(torch.equal(r[k], g[k]) for k in r)


class _Block(nn.Module):
    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


def _steered_steps(model: nn.Module, how: str, ctx: Any) -> list[list[torch.Tensor]]:
    """Three steps whose loop changes a forward hook of a block's layer (or a global one)
    between each forward and its backward, in the way ``how`` names."""
    def scale(m: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor | None:
        return out * 1.5 if isinstance(m, nn.Linear) else None

    layer = model.inner[1].fc1  # type: ignore[union-attr,index]
    out = []
    with ctx if ctx is not None else contextlib.nullcontext():
        for s in range(3):
            x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s))
            if how == "removed":  # a steering hook held only around the forward
                h = layer.register_forward_hook(scale)
                loss = model(x)
                h.remove()
            elif how == "global_removed":
                h = torch.nn.modules.module.register_module_forward_hook(scale)
                loss = model(x)
                h.remove()
            elif how == "one_shot":  # a hook that removes itself as it runs

                box: dict[str, Any] = {}

                def once(m: nn.Module, a: Any, o: torch.Tensor, box: dict[str, Any] = box) -> torch.Tensor:
                    box["handle"].remove()
                    return o * 1.5

                box["handle"] = layer.register_forward_hook(once)
                loss = model(x)
            else:  # "added": a hook registered after the forward, taken out after the step
                loss = model(x)
                h = layer.register_forward_hook(scale)
            loss.backward()
            if how == "added":
                h.remove()
            out.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
            model.zero_grad()
    return out


@pytest.mark.parametrize("how", ["removed", "global_removed", "one_shot", "added"])
@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_replay_runs_the_forward_hooks_of_its_forward(how: str, variant: str) -> None:
    """A forward hook the loop (or the hook itself) took out between a forward and its
    backward, or one the loop registered there, was run, or not, by the replay as the
    tables then stood: the replayed layer's output scaled where the forward's was not, or
    the reverse, and every gradient below it off, silently. The tables are as the loop
    left them afterwards."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Block() for _ in range(3)])
    ref = _steered_steps(_Scalar(copy.deepcopy(model)), how, None)
    m = copy.deepcopy(model)
    budget = None
    if variant != "recompute":
        budget = tight_budget(_Scalar(m), lambda s: torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s)))
    got = _steered_steps(_Scalar(m), how, variant_runtime(m, variant, budget))
    for r, g in zip(ref, got):
        assert all(torch.equal(a, b) for a, b in zip(r, g))
    assert not torch.nn.modules.module._global_forward_hooks
    assert all(not b.fc1._forward_hooks for b in m)


class _Wrapped(nn.Module):
    """A LoRA-like wrapper put in around a layer: the layer's output plus a scaled path."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner
        self.down = nn.Linear(inner.in_features, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 0.5 * self.down(x).sum(-1, keepdim=True)


class _Acts(nn.Module):
    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self.act: nn.Module = nn.GELU()
        self.extra = nn.ModuleList([nn.Linear(h, h)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.extra:
            x = x + torch.tanh(layer(x))
        return x + self.fc2(self.act(self.fc1(x)))


def _swap_between(model: nn.Sequential, how: str, ctx: Any) -> list[list[torch.Tensor]]:
    """Three steps whose loop sets a child of each block between its forward and its
    backward, and sets it back after the step."""
    out = []
    with ctx if ctx is not None else contextlib.nullcontext():
        for s in range(3):
            x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s))
            loss = model(x).square().mean()
            before = [(b.act, b.fc1, b.extra[0]) for b in model]
            for b in model:
                if how == "activation":
                    b.act = nn.ReLU()
                elif how == "wrapper":
                    b.fc1 = _Wrapped(b.fc1)
                else:  # "list_entry"
                    b.extra[0] = nn.Linear(16, 16)
            loss.backward()
            for b, (act, fc1, extra) in zip(model, before):
                b.act, b.fc1, b.extra[0] = act, fc1, extra
            out.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
            model.zero_grad()
    return out


@pytest.mark.parametrize("how", ["activation", "wrapper", "list_entry"])
@pytest.mark.parametrize("variant", ["recompute", "auto_tight"])
def test_a_replay_runs_the_children_its_forward_ran(how: str, variant: str) -> None:
    """NOTE [Children at entry]: a child the loop sets between a forward and its backward
    (an activation swapped, a wrapper put in around a layer, a list entry replaced) was
    what the replay ran: other activations, every gradient below it off, silently. The
    children are as the loop left them afterwards."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Acts() for _ in range(3)])
    ref = _swap_between(copy.deepcopy(model), how, None)
    m = copy.deepcopy(model)
    budget = None
    if variant != "recompute":
        budget = tight_budget(_Scalar(m), lambda s: torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s)))
    got = _swap_between(m, how, variant_runtime(m, variant, budget))
    for r, g in zip(ref, got):
        assert all(torch.equal(a, b) for a, b in zip(r, g))
    assert all(type(b.act) is nn.GELU and type(b.fc1) is nn.Linear for b in m)
