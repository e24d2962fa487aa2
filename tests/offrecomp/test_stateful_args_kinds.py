"""NOTE [Stateful arguments]: a memory the caller carries from block to block through an
argument object replays as each block read it, whatever holds it: an object's
``__dict__`` or its slots (``@dataclass(slots=True)``, frozen too), a tuple holding a
list, a namedtuple."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from tests.helpers import ZOO_VARIANTS, check_variant


class _Plain:
    def __init__(self) -> None:
        self.mem: torch.Tensor | None = None


@dataclasses.dataclass(slots=True)
class _Slotted:
    mem: torch.Tensor | None = None


@dataclasses.dataclass(slots=True, frozen=True)
class _Frozen:
    box: list[torch.Tensor]


class _OwnSlots:
    __slots__ = ("__mem",)  # private: mangled to _OwnSlots__mem

    def get(self) -> torch.Tensor:
        return self.__mem

    def set(self, t: torch.Tensor) -> None:
        self.__mem = t


class _Pair(NamedTuple):
    box: list[torch.Tensor]
    scale: float


class _TupleState(tuple):  # type: ignore[type-arg]
    """A tuple subclass carrying the memory in its ``__dict__``."""


class _Base:
    __slots__ = ("_raw", "mem", "scale")


class _Shadowed(_Base):
    """A base's slot named again by a property: a read makes a new float each time."""

    __slots__ = ()

    def __init__(self) -> None:
        self._raw = 0.5

    @property  # type: ignore[misc]
    def scale(self) -> float:  # type: ignore[override]
        return self._raw * 2.0


def _set_first(box: list[torch.Tensor], t: torch.Tensor) -> None:
    if box:
        box[0] = t
    else:
        box.append(t)


def _set_mem(s: Any, t: torch.Tensor) -> None:
    s.mem = t


def _set_in_tuple(s: _Plain, t: torch.Tensor) -> None:
    if s.mem is None:
        s.mem = ([t],)  # type: ignore[assignment]
    else:
        s.mem[0][0] = t  # type: ignore[index]


# (make, read, write) per kind of holder; the loop writes after each block
_KINDS: dict[str, tuple[Callable[[], Any], Callable[[Any], torch.Tensor], Callable[[Any, torch.Tensor], None]]] = {
    "dict_object": (_Plain, lambda s: s.mem, _set_mem),
    "slots_dataclass": (_Slotted, lambda s: s.mem, _set_mem),
    "frozen_slots_holding_a_list": (lambda: _Frozen([]), lambda s: s.box[0], lambda s, t: _set_first(s.box, t)),
    "private_slot": (_OwnSlots, lambda s: s.get(), lambda s, t: s.set(t)),
    "tuple_holding_a_list": (_Plain, lambda s: s.mem[0][0], _set_in_tuple),
    "namedtuple_holding_a_list": (lambda: _Pair([], 1.0), lambda s: s.box[0] * s.scale, lambda s, t: _set_first(s.box, t)),
    "tuple_subclass_with_attrs": (lambda: _TupleState(()), lambda s: s.mem, _set_mem),
    "slot_shadowed_by_a_property": (_Shadowed, lambda s: s.mem * s.scale, _set_mem),
}


class _Block(nn.Module):
    def __init__(self, read: Callable[[Any], torch.Tensor]) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.__dict__["read"] = read

    def forward(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)) * self.read(state)


class _Model(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        make, read, write = _KINDS[kind]
        self.blocks = nn.ModuleList(_Block(read) for _ in range(4))
        self.g = nn.Linear(16, 16)
        self.__dict__.update(make=make, write=write)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.make()
        self.write(state, torch.ones_like(x))
        for b in self.blocks:
            y = b(x, state)
            self.write(state, torch.sigmoid(self.g(y)))  # the next block reads this one's memory
            x = y
        return x.square().mean()


def _batch(seed: int) -> torch.Tensor:
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
@pytest.mark.parametrize("kind", list(_KINDS))
def test_a_memory_carried_through_an_argument_replays_as_read(kind: str, variant: str) -> None:
    torch.manual_seed(0)
    model = _Model(kind)
    rt, _ = check_variant(model, _batch, variant, steps=4)
    if variant == "recompute":
        assert all(s.replays > 0 for s in rt.report().steps)
