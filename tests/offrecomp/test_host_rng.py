"""Regions that draw from Python's ``random``, numpy's global RNG or RNG objects of the
model's (NOTE [Host random states] in offrecomp/host_rng.py): a replay draws what its
forward drew, and leaves the caller's states as it found them."""

from __future__ import annotations

import copy
import random
import types

import numpy as np
import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import host_rng
from tests import models
from tests.helpers import assert_bitwise, check_variant, train

VARIANTS = ["recompute", "auto_tight", "auto_serve"]


def _batch(s: int) -> torch.Tensor:
    return torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(s))


class _PyScale(nn.Module):
    """Scales its branch by a draw from Python's ``random``: the same ops in a replay,
    other values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * (0.5 + random.random()))


class _NumpyNoise(nn.Module):
    """Adds noise drawn from numpy's global RNG, a tensor made without an op."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.from_numpy(np.random.rand(*x.shape).astype(np.float32))
        return x + torch.tanh(self.fc(x)) * noise


class _PyLayerDrop(nn.Module):
    """Skips its branch on a draw from Python's ``random`` (layer dropout inside the
    block): a replay that drew another value would run other ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if random.random() < 0.5:
            return x + h
        return x + torch.tanh(self.fc2(h)) * h


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


@pytest.mark.parametrize("block", [_PyScale, _NumpyNoise, _PyLayerDrop])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_replay_draws_what_its_forward_drew_from_host_random_states(variant: str, block: type) -> None:
    torch.manual_seed(0)
    # a block dropped on a draw saves other tensors from call to call: auto measures again,
    # and reaches a plan in six steps. serves=False: the other blocks' half-keep plans drop
    # or keep activations so that a replay finds no held op output to serve from
    stable = block is not _PyLayerDrop
    check_variant(
        models.Stack([block() for _ in range(3)]), _batch, variant, stable=stable, steps=4 if stable else 6,
        serves=None if block is _PyLayerDrop else False, plans=True,
    )


@pytest.mark.parametrize("block", [_PyScale, _NumpyNoise])
def test_replays_leave_the_callers_host_random_states_as_a_plain_step_does(block: type) -> None:
    """After a step whose backward replayed every block, the loop's next draws from
    ``random`` and numpy are those of a plain step."""

    def step(model: nn.Module) -> tuple[float, float]:
        random.seed(5)
        np.random.seed(5)
        torch.manual_seed(5)
        model(_batch(0)).backward()
        return random.random(), float(np.random.rand())

    torch.manual_seed(0)
    model = models.Stack([block() for _ in range(3)])
    plain = step(model)
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        got = step(model)
    assert rt.report().steps[-1].replays > 0
    assert got == plain


@pytest.mark.parametrize(("block", "kinds"), [(_Plain, 0), (_PyScale, 1), (_NumpyNoise, 2)])
def test_only_a_region_seen_drawing_from_host_states_captures_them(block: type, kinds: int) -> None:
    """Their capture costs about 10 us for ``random`` and 40 us for numpy per call: a
    region's first call tells which it draws from."""
    torch.manual_seed(0)
    model = models.Stack([block() for _ in range(3)])
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        for s in range(2):
            model(_batch(s)).backward()
    assert [r.host_rng for r in rt._regions] == [kinds] * 3


class _OwnPyScale(nn.Module):
    """Scales its branch by a draw from a ``random.Random`` of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.rng = random.Random(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * (0.5 + self.rng.random()))


class _OwnNumpyNoise(nn.Module):
    """Adds noise drawn from a numpy ``Generator`` held by a submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.noise = _Noise(np.random.default_rng(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)) * self.noise(x)


class _Noise(nn.Module):
    def __init__(self, rng: object) -> None:
        super().__init__()
        self.rng = rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.rng.random(x.shape).astype(np.float32))  # type: ignore[attr-defined]


class _OwnLegacyDrop(nn.Module):
    """Skips its branch on a draw from a numpy ``RandomState`` of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, 32)
        self.rng = np.random.RandomState(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.rng.rand() < 0.5:
            return x + h
        return x + torch.tanh(self.fc2(h)) * h


class _TakesRng(nn.Module):
    """Draws a scale from the RNG object its caller passes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, rng: random.Random) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * (0.5 + rng.random()))


class _PassesRng(nn.Module):
    """Blocks that share one RNG object, passed to each call."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(4)
        self.blocks = nn.ModuleList([_TakesRng() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, self.rng)
        return x.square().mean()


class _ConfigRng(nn.Module):
    """Draws a scale from a numpy ``Generator`` its config object holds."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.cfg = types.SimpleNamespace(rng=np.random.default_rng(3), base=0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * (self.cfg.base + self.cfg.rng.random()))


class _ListRng(nn.Module):
    """Draws a scale from the second of a list of ``random.Random``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.rngs = [random.Random(4), random.Random(5)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * (0.5 + self.rngs[1].random()))


class _BoundDraw(nn.Module):
    """Adds noise from a bound method of a numpy ``Generator`` (``rng.standard_normal``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.draw = np.random.default_rng(7).standard_normal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.from_numpy(self.draw(x.shape).astype(np.float32))
        return x + torch.tanh(self.fc(x)) * noise


def _sampler(seed: int) -> object:
    rng = random.Random(seed)
    return lambda: 0.5 + rng.random()


class _ClosureRng(nn.Module):
    """Draws a scale through a function whose closure holds a ``random.Random``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.sample = _sampler(9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * self.sample())  # type: ignore[operator]


@pytest.mark.parametrize("block", [_ConfigRng, _ListRng, _BoundDraw, _ClosureRng])
def test_a_replay_draws_what_its_forward_drew_from_rng_objects_one_step_away(block: type) -> None:
    """NOTE [Host random states]: an RNG object held one step from a module attribute (a
    config's attribute, a list's item, a bound method's object, a closure's cell) is
    captured too; a replay drawing anew there gave other gradients, silently. (Models
    built twice: a deep copy shares a closure's cells.)"""

    def run(mode: str | None) -> tuple[list[dict[str, torch.Tensor]], int]:
        torch.manual_seed(0)
        model = models.Stack([block() for _ in range(3)])
        rt = offrecomp.runtime(model, mode=mode, min_bytes=0) if mode else None
        got = train(model, _batch, rt, steps=3)
        return got, rt.report().steps[-1].replays if rt is not None else 0

    plain, _ = run(None)
    got, replays = run("recompute")
    assert replays > 0
    assert_bitwise(plain, got)


@pytest.mark.parametrize("block", [_OwnPyScale, _OwnNumpyNoise, _OwnLegacyDrop])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_replay_draws_what_its_forward_drew_from_rng_objects_of_the_model(variant: str, block: type) -> None:
    torch.manual_seed(0)
    # serves=False: as for the host-RNG blocks above
    check_variant(
        models.Stack([block() for _ in range(3)]), _batch, variant, stable=block is not _OwnLegacyDrop,
        serves=None if block is _OwnLegacyDrop else False, plans=True,
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_replay_draws_what_its_forward_drew_from_an_rng_object_among_its_arguments(variant: str) -> None:
    torch.manual_seed(0)
    check_variant(_PassesRng(), _batch, variant, serves=False)  # as for the host-RNG blocks above


@pytest.mark.parametrize("block", [_OwnPyScale, _OwnNumpyNoise, _OwnLegacyDrop])
def test_replays_leave_the_models_rng_objects_as_a_plain_step_does(block: type) -> None:
    """After a step whose backward replayed every block, each block's RNG object draws
    next what it draws after a plain step."""

    def step(model: nn.Module) -> list[float]:
        torch.manual_seed(5)
        model(_batch(0)).backward()
        return [float(m.rng.random()) for m in model.modules() if hasattr(m, "rng")]

    torch.manual_seed(0)
    model = models.Stack([block() for _ in range(3)])
    plain = step(copy.deepcopy(model))
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        got = step(model)
    assert rt.report().steps[-1].replays > 0
    assert got == plain


def test_a_region_that_starts_drawing_late_is_found_and_replays_its_draws_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A forward that draws from ``random`` only once a schedule turns it on, after its
    region's first probed calls: a later check finds it, with a warning, and every step
    after that check is bitwise a plain step's."""

    class Late(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.p = 0.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = 1.0 + self.p * random.random() if self.p else 1.0
            return x + torch.tanh(self.fc(x) * scale)

    def run(model: nn.Module, steps: range) -> list[torch.Tensor]:
        grads = []
        for s in steps:
            if s == 10:
                for m in model.modules():
                    if isinstance(m, Late):
                        m.p = 0.5
            random.seed(s)
            model.zero_grad()
            model(_batch(s)).backward()
            grads.append(torch.cat([q.grad.flatten() for q in model.parameters()]))
        return grads

    torch.manual_seed(0)
    model = models.Stack([Late() for _ in range(2)])
    plain = run(copy.deepcopy(model), range(2 * host_rng.REPROBE + 2))
    with caplog.at_level("WARNING", logger="offrecomp"), offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        got = run(model, range(2 * host_rng.REPROBE + 2))
    assert all(r.host_rng & host_rng.PY for r in rt._regions)
    found = host_rng.REPROBE  # the region's call (one per step) that found it
    for s in range(found, len(plain)):
        assert torch.equal(got[s], plain[s]), s
    assert "none of its first" in caplog.text


def test_a_block_whose_sibling_drew_captures_the_state_before_it_draws_itself() -> None:
    """Two blocks of one class draw from numpy only when a torch draw lets them (a layer
    drop); the first draws at once, the second first after its probed calls. A class
    whose block was seen drawing captures the state in all its blocks; learnt per block,
    the second would capture no numpy state and its replays would draw new noise,
    gradients silently off a plain run's."""

    class Dropped(nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.index = index

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            draws = DRAWS[step[0]][self.index]
            torch.rand(())  # the torch draw the drop would take (replays restore it)
            if not draws:
                return x
            noise = torch.from_numpy(np.random.rand(*x.shape).astype(np.float32))
            return x + torch.tanh(self.fc(x + noise))

    late = host_rng.PROBES + 2  # the second block's first draw: after its probed calls
    DRAWS = [(True, s == late) for s in range(late + 2)]
    step = [0]

    def run(model: nn.Module) -> list[torch.Tensor]:
        grads = []
        for s in range(len(DRAWS)):
            step[0] = s
            np.random.seed(s)
            model.zero_grad()
            model(_batch(s)).sum().backward()
            grads.append(torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None]))
        return grads

    torch.manual_seed(0)
    model = models.Stack([Dropped(0), Dropped(1)])
    plain = run(copy.deepcopy(model))
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        got = run(model)
    assert all(r.host_rng & host_rng.NUMPY for r in rt._regions)
    assert all(torch.equal(a, b) for a, b in zip(got, plain))


class _Tiny(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.fc(x)))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_calls_that_draw_nothing_share_one_cpu_generator_state(dropout: float) -> None:
    """NOTE [Shared CPU generator states] (regions.py): each call that may replay held a
    copy of the CPU generator's state (5,056 B; 16 calls of a small spiking network: 81
    KB, its activations 85 KB). Calls between which nothing drew share one; with dropout
    drawing in every call each holds its own; gradients bitwise either way."""
    from offrecomp.regions import capture_rng

    first, second = capture_rng([torch.device("cpu")]), capture_rng([torch.device("cpu")])
    assert second.cpu is first.cpu
    torch.rand(1)
    assert capture_rng([torch.device("cpu")]).cpu is not first.cpu
    torch.manual_seed(0)
    model = nn.Sequential(*(_Tiny(dropout) for _ in range(6)))
    states: list[torch.Tensor] = []
    original = offrecomp.calls.capture_rng

    def spy(*args: object, **kwargs: object) -> object:
        state = original(*args, **kwargs)  # type: ignore[arg-type]
        states.append(state.cpu)
        return state

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(s))

    class _Loss(nn.Module):
        def __init__(self, m: nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m(x).square().mean()

    ref = train(_Loss(copy.deepcopy(model)), batch, steps=2)
    ours = _Loss(copy.deepcopy(model))
    rt = offrecomp.runtime(ours, mode="recompute", min_bytes=0, regions=lambda m, name: name.startswith("m.") and name.count(".") == 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(offrecomp.calls, "capture_rng", spy)
        got = train(ours, batch, rt, steps=2)
    assert_bitwise(ref, got)
    distinct = len({id(s) for s in states[-6:]})
    assert distinct == (1 if dropout == 0.0 else 6), distinct
