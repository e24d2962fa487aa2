"""NOTE [Region refresh] (offrecomp/changes.py): modules, buffers and parameters added to
a block while the runtime is entered, regions replaced, and forwards patched meanwhile."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from tests.helpers import assert_bitwise, assert_ends_planned, tight_budget, train, variant_runtime
from tests.models import Stack

H = 16


class _Growing(nn.Module):
    """Uses whatever was added to it: a BatchNorm, a running average buffer (read and
    updated in place by its forward), an adapter with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        if "norm" in self._modules:
            h = self.norm(h.flatten(0, 1)).view_as(h)
        if "avg" in self._buffers:
            self.avg.mul_(0.9).add_(0.1 * h.detach().mean((0, 1)))
            h = h * self.avg
        if "adapter" in self._modules:
            h = h + self.adapter(h)
        return x + self.fc2(torch.tanh(h))


def _add(block: nn.Module, what: str) -> None:
    if what == "batchnorm":
        block.norm = nn.BatchNorm1d(2 * H)
    elif what == "buffer":
        block.register_buffer("avg", torch.ones(2 * H))
    else:
        block.adapter = nn.Sequential(nn.Linear(2 * H, 2 * H), nn.Dropout(0.3))


def _batch(s: int) -> torch.Tensor:
    return torch.randn(4, 6, H, generator=torch.Generator().manual_seed(s))


def _run_changing(
    model: nn.Module, rt: Any, change: Callable[[nn.Module], Any], *, steps: int = 5, at: int = 2,
    eval_between: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Trains ``steps`` steps, applying ``change`` to every block before step ``at``;
    returns grads and buffers after each step. ``eval_between``: eval mode between each
    forward and its backward (the replay must run the forward's train flags)."""
    out = []
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(steps):
            if step == at:
                torch.manual_seed(99)
                for b in model.blocks:
                    change(b)
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
            torch.manual_seed(step)
            loss = model(_batch(step))
            if eval_between:
                model.eval()
            loss.backward()
            if eval_between:
                model.train()
            snap = {f"grad.{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            snap.update({f"buf.{n}": b.clone() for n, b in model.named_buffers()})
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("what", ["batchnorm", "buffer", "adapter"])
@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_modules_added_to_blocks_while_entered_replay_right(what: str, variant: str) -> None:
    """The replays of later calls restore the new buffers and train flags, as for blocks
    built with them: bitwise equal to plain."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(3)])

    def add(b: nn.Module) -> None:
        _add(b, what)

    ref = _run_changing(copy.deepcopy(model), None, add, steps=6, eval_between=what == "adapter")
    budget = tight_budget(model, _batch) if variant == "auto_serve" else None
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, _run_changing(m, rt, add, steps=6, eval_between=what == "adapter"))
    # every block still replays after the change (at step 2; under auto, some: measuring
    # passes replay all), and auto plans it again
    steps = rt.report().steps
    want = 3 if variant == "recompute" else 1  # a plan may keep some call whole
    assert all(s.replays >= want and s.recomputed_bytes > 0 for s in steps), [
        (s.phase, s.replays, s.recomputed_bytes) for s in steps
    ]
    if variant == "auto_serve":
        assert_ends_planned(steps)


@pytest.mark.parametrize("how", ["reorder", "wrap"])
def test_regions_moved_to_other_names_are_not_called_replaced(how: str, caplog: pytest.LogCaptureFixture) -> None:
    """Blocks reordered, or one wrapped in another module: the same region objects, still
    replayed, were named "no longer the model's modules ... run plainly" (the one warning
    a later real replacement would have needed)."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(3)])
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        model(_batch(0)).backward()
        b = model.blocks
        if how == "reorder":
            b[0], b[2] = b[2], b[0]
        else:
            b[1] = nn.Sequential(b[1])
        model(_batch(1)).backward()
    assert "no longer the model's modules" not in caplog.text
    steps = rt.report().steps
    assert steps[1].replays == steps[0].replays == 3


def test_a_region_replaced_while_entered_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """The runtime manages the modules it found; the new ones run plainly, with a warning
    naming the regions."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(2)])
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        model(_batch(0)).backward()
        model.blocks = nn.ModuleList(copy.deepcopy(list(model.blocks)))
        model(_batch(1)).backward()
    assert "blocks.0, blocks.1 are no longer the model's modules" in caplog.text
    steps = rt.report().steps
    assert steps[0].recomputed_bytes > 0 and steps[1].recomputed_bytes == 0


@pytest.mark.parametrize("how", ["replaced", "appended"])
def test_a_region_replaced_or_a_block_appended_between_entries_is_named(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Between two entries torch's registration hooks are not the runtime's, so no
    assignment is counted: the next entry reads the regions all the same and names the
    change, as while entered."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(2)])
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with rt:
        model(_batch(0)).backward()
    if how == "replaced":
        model.blocks[1] = copy.deepcopy(model.blocks[1])
    else:
        model.blocks.append(_Growing())
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        model(_batch(1)).backward()
    said = "blocks.1 are no longer the model's modules" if how == "replaced" else "module(s) blocks.2, added beside"
    assert said in caplog.text


def test_a_block_appended_while_entered_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """A block appended beside the regions runs plainly, named once; gradients stay
    bitwise. Blocks that ``regions=`` left out when the runtime was made are not named."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(2)])

    def loop(m: nn.Module, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
        grads = []
        with rt if rt is not None else contextlib.nullcontext():
            for s in range(4):
                if s == 2:
                    torch.manual_seed(1)
                    m.blocks.append(_Growing())
                m(_batch(s)).backward()
                grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
                m.zero_grad()
        return grads

    ref = loop(copy.deepcopy(model), None)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        got = loop(m, rt)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert caplog.text.count("module(s) blocks.2, added beside the regions") == 1
    assert list(rt.regions) == ["blocks.0", "blocks.1"]
    caplog.clear()
    m = copy.deepcopy(model)
    only = offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=lambda mod, name: name == "blocks.0")
    with caplog.at_level(logging.WARNING, logger="offrecomp"), only:
        m(_batch(0)).backward()
    assert "added beside the regions" not in caplog.text


def test_each_runtime_names_its_replaced_regions_once(caplog: pytest.LogCaptureFixture) -> None:
    """Once per runtime, however many runtimes a process makes (a new one often takes a
    collected one's address)."""
    import gc

    n = 12
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        for _ in range(n):
            torch.manual_seed(0)
            model = Stack([_Growing() for _ in range(2)])
            rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
            with rt:
                model(_batch(0)).backward()
                model.blocks[1] = copy.deepcopy(model.blocks[1])
                model(_batch(1)).backward()
                model(_batch(2)).backward()
            del model, rt
            gc.collect()
    assert caplog.text.count("are no longer the model's modules") == n
    from offrecomp import diagnostics  # nothing process-wide, keyed by an address, says it was said

    assert not any("replaced" in key for key in diagnostics._warned)


@pytest.mark.parametrize("where", ["block", "model"])
def test_a_forward_patched_while_entered_outlives_the_exit(where: str) -> None:
    """A forward set while the runtime is entered (an adapter library's) is the user's:
    leaving the runtime does not take it away, and the model runs it without the
    runtime afterwards."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(2)])
    target: nn.Module = model.blocks[0] if where == "block" else model
    x = _batch(0)
    with offrecomp.runtime(model, mode="recompute", min_bytes=0):
        inner: Callable[..., torch.Tensor] = target.forward
        target.forward = lambda *a: inner(*a) * 2.0  # type: ignore[method-assign]
        inside = model(x).detach()
    assert "forward" in target.__dict__
    assert torch.equal(model(x).detach(), inside)


class _Rotary(nn.Module):
    """A cache filled in place on first use, guarded by a plain int (rotary-embedding-
    torch's pattern), grown when a longer sequence comes."""

    def __init__(self, d: int = H) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)), persistent=False)
        self.register_buffer("cached", torch.zeros(32, d), persistent=False)
        self.cached_len = 0

    def forward(self, t: int) -> torch.Tensor:
        if t <= self.cached_len:
            return self.cached[:t]
        f = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        f = torch.cat([f, f], -1)
        self.cached[:t] = f
        self.cached_len = t
        return f


class _RotaryBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rot = _Rotary()
        self.lin = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        f = self.rot(x.shape[1])
        return x + torch.tanh(h * f.cos() + h.flip(-1) * f.sin())


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_attributes_a_forward_sets_are_as_at_entry_in_its_replay(variant: str) -> None:
    """NOTE [Module attributes]: the replay gets the cache as it was at entry (empty)
    and the int guard too, so it fills the cache again; lengths grow at steps 2 and 4."""
    torch.manual_seed(0)
    model = Stack([_RotaryBlock() for _ in range(3)])
    lengths = [6, 6, 9, 9, 12, 12, 12, 12]  # each length measured and calibrated; the last planned

    def batch(s: int) -> torch.Tensor:  # train() asks for seeds 0, 10, 20, ...
        return torch.randn(2, lengths[s // 10], H, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=len(lengths))
    budget = tight_budget(model, batch) if variant == "auto_serve" else None
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, train(m, batch, rt, steps=len(lengths)))
    # every block replays in every step, the grown cache's steps included
    steps = rt.report().steps
    want = 3 if variant == "recompute" else 1  # a plan may keep some call whole
    assert all(s.replays >= want and s.recomputed_bytes > 0 for s in steps), [
        (s.phase, s.replays, s.recomputed_bytes) for s in steps
    ]
    if variant == "auto_serve":
        assert_ends_planned(steps, 2)



class _AnnealedScale(nn.Module):
    """Sets its scale once per forward, outside replays as offrecomp's docs advise for side
    effects, and computes with it; ``initial``: the attribute exists before the first
    call (else its first forward adds it)."""

    def __init__(self, initial: bool) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(H, H), nn.Linear(H, H)
        self.calls = 0
        if initial:
            self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not offrecomp.in_replay():
            self.calls += 1
            self.scale = 1.0 + 0.1 * self.calls
        return x + self.lin2(torch.tanh(self.lin1(x) * self.scale))


class _DecaysAfterUse(nn.Module):
    """Computes with its scale, then anneals it only outside a replay: the replay must
    read the entry value before the guard."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(H, H), nn.Linear(H, H)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin1(x) * self.scale)
        if not offrecomp.in_replay():
            self.scale = self.scale * 0.9
        return x + self.lin2(h)


class _LogsThenDecays(nn.Module):
    """Asks ``in_replay()`` (to log), reads its scale, and decays it after its last save,
    where an early-stopped replay does not reach: the replay must read the entry value."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)
        self.scale = 1.0
        self.logged = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not offrecomp.in_replay():
            self.logged += 1
        h = torch.tanh(self.lin(x) * self.scale)
        self.scale = self.scale * 0.9
        return x + h


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
@pytest.mark.parametrize("block", ["annealed", "annealed_added", "decays_after_use", "logs_then_decays"])
def test_attributes_a_forward_sets_only_outside_a_replay_keep_the_forwards_value(block: str, variant: str) -> None:
    """NOTE [Module attributes]: an attribute set under ``if not offrecomp.in_replay()``
    was put back to its entry value for the replay, which did not set it again: other
    gradients, silently (or an AttributeError where the first forward added it). A
    replay that asked and left it at its entry value runs again with the forward's value
    put in at its guard, and its region's replays from then on (read before the guard,
    it is the entry value); one that only stopped before an attribute's update (run to
    its end once to tell) reads the entry value, as before."""
    factory = {
        "annealed": lambda: _AnnealedScale(True),
        "annealed_added": lambda: _AnnealedScale(False),
        "decays_after_use": _DecaysAfterUse,
        "logs_then_decays": _LogsThenDecays,
    }[block]
    torch.manual_seed(0)
    model = Stack([factory() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 5, H, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=4)
    budget = tight_budget(model, batch) if variant == "auto_serve" else None
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, train(m, batch, rt, steps=4))
    guarded = {n for r in rt._regions for n in r.guarded_attrs}
    want = {"annealed": {"calls", "scale"}, "annealed_added": {"calls", "scale"}, "decays_after_use": {"scale"}}
    assert guarded == want.get(block, {"logged"}), guarded


class _LoRA(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 4) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(r, base.in_features) * 0.1)
        self.b = nn.Parameter(torch.zeros(base.out_features, r))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.t() @ self.b.t()


class _MlpBlock(nn.Module):
    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.fc1: nn.Module = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def test_an_adapter_added_then_merged_away_is_planned_again_each_time() -> None:
    """NOTE [Region refresh]: a region whose modules changed (an adapter wrapped around a
    layer at step 3, merged away at step 7) runs another forward, and what its earlier
    calls showed is forgotten: each change measures again, and no region is taken for
    one whose saves vary with the data (which would keep every activation from then on,
    1.7x the budget). The budget is 0.6 of keep's peak: a calibration pass, which drops
    every activation, holds 0.57 of it, its replays' transients counted (NOTE [Replay
    transients] in scheduler/working_set.py)."""

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(s))

    torch.manual_seed(0)
    model = Stack([_MlpBlock() for _ in range(4)])
    budget = tight_budget(model, batch) * 6 // 5
    rt = offrecomp.runtime(model, mode="auto", budget=budget, min_bytes=0, drift=100.0)
    with rt:
        for step in range(12):
            for b in model.blocks:
                if step == 3:
                    b.fc1 = _LoRA(b.fc1)
                elif step == 7:
                    b.fc1 = b.fc1.base
            model(batch(step)).backward()
    steps = rt.report().steps
    assert not any(r.variable for r in rt._regions)  # type: ignore[attr-defined]
    assert steps[-1].phase == "planned"
    assert all(s.peak_activation_bytes <= 1.05 * budget for s in steps[-3:]), [s.peak_activation_bytes for s in steps]


class _Sliced(nn.Module):
    """As a Hugging Face decoder: its forward slices its layer list (a new ModuleList at
    every call) and builds a module it uses once."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Growing() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks[: len(self.blocks)]:
            x = b(x)
        return nn.Identity()(x).square().mean()


def test_modules_made_outside_the_model_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Region refresh]: the slice and the module built in the forward are not the
    model's: no region is read again, nor its first-call watch run again, at later steps
    (a watch over every call of a Hugging Face decoder would double its recompute steps'
    host time); a module assigned into a block still counts."""
    import offrecomp.calls

    watched: list[str] = []

    class Counting(offrecomp.calls.FirstCallWatch):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            watched.append("watch")

    monkeypatch.setattr(offrecomp.calls, "FirstCallWatch", Counting)
    torch.manual_seed(0)
    model = _Sliced()
    ref = train(copy.deepcopy(model), _batch, steps=4)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(m, _batch, rt, steps=4))
    assert len(watched) == 3, watched  # each region's first call
    with rt:
        _add(m.blocks[0], "adapter")
        m(_batch(9)).backward()
    assert len(watched) == 6, watched  # a module assigned into the model: every region is read again


class _Ema(nn.Module):
    """A running mean its forward updates in place (read before the update)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("avg", torch.zeros(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x - self.avg
        if self.training:
            self.avg.mul_(0.9).add_(0.1 * x.detach().mean((0, 1)))
        return out


class _Parts(nn.Module):
    """Holds layers in each of torch's containers, and one as an attribute, and uses
    whatever they hold."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Linear(H, H))
        self.layers = nn.ModuleList([nn.Linear(H, H), nn.Tanh()])
        self.extra = nn.ModuleDict({"a": nn.Linear(H, H), "b": nn.Linear(H, H)})
        self.gate = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.seq(x)
        for layer in self.layers:
            h = layer(h)
        for m in self.extra.values():
            h = h + m(h)
        if "gate" in self._modules:
            h = h * torch.sigmoid(self.gate(h))
        return x + h


#: Changes to a block's modules that run none of torch's registration hooks.
_PAST_THE_HOOK: dict[str, Callable[[_Parts], Any]] = {
    "Sequential.insert": lambda b: b.seq.insert(1, _Ema()),
    "ModuleList.insert": lambda b: b.layers.insert(1, _Ema()),
    "_modules written": lambda b: b.seq._modules.__setitem__("1", nn.Sequential(nn.GELU(), _Ema())),
    "Sequential.pop": lambda b: b.seq.pop(1),
    "del Sequential[i]": lambda b: b.seq.__delitem__(slice(1, 2)),
    "ModuleList.pop": lambda b: b.layers.pop(1),
    "del ModuleList[i]": lambda b: b.layers.__delitem__(1),
    "ModuleDict.pop": lambda b: b.extra.pop("a"),
    "del ModuleDict[k]": lambda b: b.extra.__delitem__("a"),
    "ModuleDict.clear": lambda b: b.extra.clear(),
    "del module.child": lambda b: delattr(b, "gate"),
}


@pytest.mark.parametrize("how", ["Sequential.insert", "ModuleList.insert", "_modules written"])
@pytest.mark.parametrize("variant", ["recompute", "auto_serve", "model_region"])
def test_modules_set_past_the_registration_hook_replay_right(how: str, variant: str) -> None:
    """NOTE [Region refresh]: a module set into a block where torch runs no registration
    hook (``insert`` writes ``_modules`` itself) is seen at the block's next call: the
    replays restore its running mean, bitwise equal to plain (its mean was updated twice
    by every replay, silently). ``model_region``: the model is the one region, its calls
    name the passes."""
    torch.manual_seed(0)
    model = Stack([_Parts() for _ in range(3)])
    ref = _run_changing(copy.deepcopy(model), None, _PAST_THE_HOOK[how])
    m = copy.deepcopy(model)
    if variant == "model_region":
        rt = offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=Stack)
    else:
        rt = variant_runtime(m, variant, tight_budget(model, _batch) if variant == "auto_serve" else None)
    got = _run_changing(m, rt, _PAST_THE_HOOK[how])
    assert_bitwise(ref, got)
    assert all(s.replays > 0 for s in rt.report().steps)


@pytest.mark.parametrize("how", [k for k in _PAST_THE_HOOK if "insert" not in k and "written" not in k])
def test_modules_removed_past_the_registration_hook_are_let_go(how: str) -> None:
    """NOTE [Region refresh]: a module taken out of a block where torch runs no
    registration hook (``pop``, ``del``, ``clear``) leaves its region at the block's next
    call, and is freed (its region held it, and its parameters, for the runtime's life);
    gradients bitwise equal to plain."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = Stack([_Parts() for _ in range(3)])
    ref = _run_changing(copy.deepcopy(model), None, _PAST_THE_HOOK[how])
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    torch.manual_seed(99)
    removed: list[weakref.ref[nn.Module]] = []

    def change(b: nn.Module) -> None:
        before = {id(x): x for x in b.modules()}
        _PAST_THE_HOOK[how](b)
        now = {id(x) for x in b.modules()}
        removed.extend(weakref.ref(x) for i, x in before.items() if i not in now)

    got = _run_changing(m, rt, change)
    assert_bitwise(ref, got)
    gc.collect()
    assert removed and all(r() is None for r in removed), [r() for r in removed if r() is not None]
    assert all(s.replays == 3 for s in rt.report().steps)


def _rebind(b: nn.Module, how: str) -> None:
    """Sets ``b.forward`` (to the same computation) as code that replaces it does."""
    import types

    if how == "method":
        b.forward = types.MethodType(type(b).forward, b)  # type: ignore[method-assign]
    elif how == "function":
        b.forward = lambda x: type(b).forward(b, x)  # type: ignore[method-assign]
    elif how == "deleted":  # a patch undone: the class's forward again
        if "forward" in b.__dict__:
            del b.forward
    else:  # calls the runtime's wrapper through an attribute read at call time
        b.old_forward = b.forward
        b.forward = types.MethodType(lambda self, x: self.old_forward(x), b)  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["method", "function", "deleted", "attribute"])
@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_a_forward_replaced_while_entered_stays_a_region(how: str, variant: str) -> None:
    """NOTE [Forwards replaced while entered]: a block whose ``forward`` is set (or
    deleted) while the runtime is entered is still its region from the next root forward
    on (it ran plainly, every activation kept, left out of ``explain()``), bitwise equal
    to plain; exit leaves the new forward in place."""
    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(3)])
    ref = _run_changing(copy.deepcopy(model), None, lambda b: _rebind(b, how))
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, tight_budget(model, _batch) if variant == "auto_serve" else None)
    got = _run_changing(m, rt, lambda b: _rebind(b, how))
    assert_bitwise(ref, got)
    steps = rt.report().steps
    if variant == "recompute":
        assert [s.replays for s in steps] == [3] * len(steps)
        assert len({s.peak_activation_bytes for s in steps}) == 1, [s.peak_activation_bytes for s in steps]
    assert all(f"blocks.{i}" in rt.explain() for i in range(3))
    from offrecomp.slots import Installed

    for b in m.blocks:
        slot = b.__dict__.get("forward")
        assert not isinstance(slot, Installed) and (slot is None) == (how == "deleted")


@pytest.mark.parametrize("how", ["closure", "wraps", "accelerate"])
def test_a_patch_around_a_regions_wrapper_is_not_wrapped_again(how: str) -> None:
    """NOTE [Forwards replaced while entered]: a forward set while entered that calls the
    runtime's wrapper (a closure over the old ``block.forward``, a ``functools.wraps``
    decorator, accelerate's ``add_hook_to_module``) stays as set: the block's calls still
    go through the wrapper, the patch's own work outside the region."""
    import functools

    def patch(b: nn.Module) -> None:
        inner = b.forward
        if how == "closure":
            b.forward = lambda x: inner(x) * 0.5  # type: ignore[method-assign]
        elif how == "wraps":
            b.forward = functools.wraps(inner)(lambda x: inner(x) * 0.5)  # type: ignore[method-assign]
        else:
            b._old_forward = inner

            def new_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
                return module._old_forward(x) * 0.5

            b.forward = functools.update_wrapper(functools.partial(new_forward, b), inner)  # type: ignore[method-assign]

    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(3)])
    ref = _run_changing(copy.deepcopy(model), None, patch)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    patches: list[Any] = []
    slots: list[list[Any]] = []  # the blocks' forward slots after each forward, entered
    m.register_forward_hook(lambda mod, args, out: slots.append([b.__dict__.get("forward") for b in mod.blocks]))
    got = _run_changing(m, rt, lambda b: (patch(b), patches.append(b.forward)))
    assert_bitwise(ref, got)
    assert [s.replays for s in rt.report().steps] == [3] * 5
    assert slots[2:] == [patches] * 3


def test_a_forward_patched_and_unpatched_every_other_step_is_wrapped_once() -> None:
    """``mock.patch.object(block, "forward", ...)`` on alternate steps: the patch's undo
    puts the runtime's own wrapper back, which was taken for a new forward and wrapped
    again, one level deeper each cycle; at exit the slot is as before the runtime."""
    from types import MethodType
    from unittest import mock

    torch.manual_seed(0)
    model = Stack([_Growing() for _ in range(3)])
    block = model.blocks[0]

    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    seen: list[int] = []
    with rt:
        for step in range(8):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
            if step % 2:
                with mock.patch.object(block, "forward", MethodType(type(block).forward, block)):
                    model(x).backward()
            else:
                model(x).backward()
            seen.append(len(rt._installer._restore))  # type: ignore[union-attr]
    assert len(set(seen)) == 1, seen  # no wrapper, nor its restore, added per cycle
    assert "forward" not in block.__dict__


def _class_patch_model() -> tuple[type[nn.Module], type[nn.Module], nn.Module]:
    """A model of fresh classes (a patch of them leaves other tests alone): its blocks,
    itself, and an instance."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.fc(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x.square().mean()

    torch.manual_seed(0)
    return Block, Model, Model()


def _sigmoid_block(self: Any, x: torch.Tensor) -> torch.Tensor:
    return x + torch.sigmoid(self.fc(x))


def _cubed_model(self: Any, x: torch.Tensor) -> torch.Tensor:
    for b in self.blocks:
        x = b(x)
    return x.pow(3).mean()


@pytest.mark.parametrize("variant", ["plain", "keep", "recompute", "offload", "auto"])
@pytest.mark.parametrize("when", ["between_steps", "before_backward"])
def test_a_class_forward_patched_while_entered_runs_from_its_next_call(variant: str, when: str) -> None:
    """NOTE [Class forwards patched while entered] (slots.py): the blocks' class and the
    model's class patched while the runtime is entered (a library's monkeypatch) run the
    new forward from their next call, as plain does, where the wrappers ran the forward
    bound at entry, silently; a call made before a patch that lands between its forward
    and its backward replays the forward it ran."""

    def run(variant: str) -> list[torch.Tensor]:
        block_cls, model_cls, m = _class_patch_model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        rt = contextlib.nullcontext() if variant == "plain" else offrecomp.runtime(m, mode=variant, min_bytes=0)
        seen = []
        with rt:
            for step in range(6):
                if step == 2 and when == "between_steps":
                    block_cls.forward = _sigmoid_block  # type: ignore[method-assign]
                if step == 4 and when == "between_steps":
                    model_cls.forward = _cubed_model  # type: ignore[method-assign]
                loss = m(torch.randn(4, H, generator=torch.Generator().manual_seed(step)))
                if step == 2 and when == "before_backward":
                    block_cls.forward = _sigmoid_block  # type: ignore[method-assign]
                    model_cls.forward = _cubed_model  # type: ignore[method-assign]
                loss.backward()
                seen += [loss.detach(), *(p.grad.clone() for p in m.parameters() if p.grad is not None)]
                opt.step()
                opt.zero_grad()
        return seen

    ref, got = run("plain"), run(variant)
    assert len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got)), variant


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


class _Doubling:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


@pytest.mark.parametrize("kind", ["staticmethod", "partial", "callable"])
def test_a_class_forward_patched_with_another_callable_runs_as_plain(kind: str) -> None:
    """NOTE [Class forwards patched while entered]: the class attribute read is bound as
    Python binds it: a staticmethod, a ``functools.partial`` or a callable object is
    called as it is, not handed the module."""
    block_cls, _, m = _class_patch_model()
    new = {"staticmethod": staticmethod(_doubled), "partial": functools.partial(_doubled), "callable": _Doubling()}[kind]
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(0))
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        m(x).backward()
        block_cls.forward = new  # type: ignore[method-assign]
        got = m(x)
    assert torch.equal(got, (x * 8.0).square().mean())


def test_a_model_moved_after_the_runtime_was_made_is_followed() -> None:
    """NOTE [Model devices] (context.py): a runtime made while the model was on the meta
    device (on a GPU: ``rt = offrecomp.runtime(model); model.cuda()``) kept that device,
    so no save on the model's new one was ever offloaded (0 bytes, silently). Each entry
    reads the model's device again."""

    def build() -> nn.Module:
        return Stack([nn.Sequential(nn.Linear(H, 4 * H), nn.ReLU(), nn.Linear(4 * H, H)) for _ in range(3)])

    def init(m: nn.Module) -> nn.Module:
        torch.manual_seed(0)
        for p in m.parameters():
            nn.init.normal_(p, std=0.1)
        return m

    def batch(s: int) -> torch.Tensor:
        return torch.randn(8, 4, H, generator=torch.Generator().manual_seed(s))

    ref = train(init(build()), batch, steps=2)
    meta = build().to("meta")
    rt = offrecomp.runtime(meta, mode="offload", min_bytes=0)
    init(meta.to_empty(device="cpu"))
    assert_bitwise(ref, train(meta, batch, rt, steps=2))
    assert all(s.offloaded_bytes > 0 for s in rt.report().steps), [s.offloaded_bytes for s in rt.report().steps]


def test_a_device_move_takes_a_new_out_of_memory_baseline() -> None:
    """NOTE [Model devices]: the allocator's out-of-memory count read at the last pass
    end is the old device's; the next pass end reads the new one's as a baseline, not as
    errors of its own (which would cut the budget to 70%)."""
    m = Stack([nn.Sequential(nn.Linear(H, H), nn.Tanh()) for _ in range(2)])
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with rt:
        m(torch.randn(2, H)).sum().backward()
    rt._life._ooms = 3  # as a CUDA allocator's count would read
    rt._device.device = torch.device("meta")  # as if made before the model moved
    with rt:
        assert rt._life._ooms is None
