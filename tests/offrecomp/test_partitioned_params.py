"""NOTE [Parameters released by their owner]: parameters that a partitioner gathers for
each forward and releases after it (DeepSpeed ZeRO-3's ``param.data = torch.empty(0)``),
emulated on one process."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from tests import models

RELEASED, GATHERED = "released", "gathered"


class _Partitioner:
    """Each module's own parameters live in ``full`` (the partition); a forward pre-hook
    (and a backward pre-hook) gathers them into new storage, and the forward hook
    releases them outside a backward, as DeepSpeed ZeRO-3 does. The hooks read an
    attribute of each Parameter (``status``), as DeepSpeed's read ``ds_status``."""

    def __init__(self, model: nn.Module) -> None:
        self.full: dict[nn.Parameter, torch.Tensor] = {}
        self.gathered: list[weakref.ref[torch.UntypedStorage]] = []
        for m in model.modules():
            own = list(m.parameters(recurse=False))
            if not own:
                continue
            for p in own:
                self.full[p] = p.detach().clone()
                p.data = torch.empty(0, dtype=p.dtype)
                p.status = RELEASED  # type: ignore[attr-defined]
            m.register_forward_pre_hook(self._gather)
            m.register_forward_hook(self._release)
            m.register_full_backward_pre_hook(lambda mod, grads: self._gather(mod, ()))

    def _gather(self, module: nn.Module, args: Any) -> None:
        for p in module.parameters(recurse=False):
            if p.status == RELEASED:  # type: ignore[attr-defined]
                p.data = self.full[p].clone()
                p.status = GATHERED  # type: ignore[attr-defined]
                self.gathered.append(weakref.ref(p.untyped_storage()))

    def _release(self, module: nn.Module, args: Any, out: Any) -> None:
        if torch._C._current_graph_task_id() == -1:  # a backward's replay keeps them for its ops
            for p in module.parameters(recurse=False):
                p.data = torch.empty(0, dtype=p.dtype)
                p.status = RELEASED  # type: ignore[attr-defined]

    def step(self, lr: float = 0.1) -> None:
        """The optimizer on the partition; every parameter released."""
        with torch.no_grad():
            for p, full in self.full.items():
                if p.grad is not None:
                    full.sub_(lr * p.grad)
                p.grad = None
                p.data = torch.empty(0, dtype=p.dtype)
                p.status = RELEASED  # type: ignore[attr-defined]

    def alive(self) -> int:
        return sum(r() is not None for r in self.gathered)


def _train(mode: str | None, steps: int = 4) -> tuple[list[list[torch.Tensor]], list[int]]:
    torch.manual_seed(0)
    model = models.HeadedStack()
    part = _Partitioner(model)
    xs = [torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(s)) for s in range(steps)]
    grads: list[list[torch.Tensor]] = []
    alive: list[int] = []
    rt = offrecomp.runtime(model, mode=mode, budget=1 << 16) if mode is not None else None
    with rt if rt is not None else torch.enable_grad():
        for x in xs:
            part.gathered.clear()
            loss = model(x)
            alive.append(part.alive())  # gathered storages still alive when the forward returned
            loss.backward()
            grads.append([p.grad.clone() for p in part.full])  # type: ignore[union-attr]
            part.step()
    return grads, alive


@pytest.mark.parametrize("mode", ["recompute", "auto", "offload", "keep"])
def test_parameters_a_partitioner_releases_are_gathered_by_its_hooks_and_not_held(mode: str) -> None:
    """A replay runs with the model's own Parameter objects (the hooks read their
    attributes; a fresh Parameter in a slot has none), gathered by the hooks; the
    gradients are plain's, bitwise; and after the first pass no call holds a gathered
    storage past the forward (at the first, the last block's, until the backward
    begins)."""
    plain, plain_alive = _train(None)
    got, alive = _train(mode)
    for a, b in zip(plain, got):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    # plain autograd holds each Linear's weight (its matmul saves ``weight.t()``): those,
    # and at the first pass the last block's other parameters
    assert plain_alive == [9, 9, 9, 9]
    assert alive[0] <= 9 + 5, alive
    assert alive[1:] == plain_alive[1:], alive


def test_a_parameter_whose_storage_is_freed_in_place_stays_held_and_rebindings_still_replay() -> None:
    """FSDP frees a parameter's storage in place (``resize_(0)``) after the forward and
    refills it when the module's backward begins, its version kept: the same storage, not
    a release, so a ``.data =`` rebinding is still replayed with the values its forward
    read (NOTE [Replay and parameters]); the gradients are plain's."""
    torch.manual_seed(0)
    model, ref = models.HeadedStack(depth=2), models.HeadedStack(depth=2)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(4, 16, 32)
    w = model.blocks[0].fc1.weight
    values = w.detach().clone()

    def refill(module: nn.Module, grads: Any) -> None:
        st = w.untyped_storage()
        if not st.nbytes():
            st.resize_(values.numel() * values.element_size())
            with torch.autograd._unsafe_preserve_version_counter(w):
                w.detach().copy_(values)

    model.blocks[0].register_full_backward_pre_hook(refill)
    with offrecomp.runtime(model, mode="recompute"):
        for _ in range(3):
            loss = model(x)
            w.untyped_storage().resize_(0)  # freed in place
            bias = model.blocks[0].fc1.bias
            before = bias.data
            bias.data = before + 1.0  # the replay must read the values from before
            loss.backward()
            bias.data = before
            ref(x).backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                assert torch.equal(p.grad, q.grad)  # type: ignore[arg-type]
                p.grad = q.grad = None
