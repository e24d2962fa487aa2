"""NOTE [Parameters released by their owner]: parameters that a partitioner gathers for
each forward and releases after it (DeepSpeed ZeRO-3's ``param.data = torch.empty(0)``),
emulated on one process."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from tests import models

RELEASED, GATHERED = "released", "gathered"


class _Partitioner:
    """The parameters ``only`` names (all by default) live in ``full`` (the partition);
    a forward pre-hook (and a backward pre-hook) gathers a module's into new storage,
    and they are freed outside a backward, as DeepSpeed ZeRO-3 does: by the module's
    forward hook, or with ``lag``, once ``lag`` more modules' forwards have begun (the
    next block's, inside its region). The hooks read an attribute of each Parameter
    (``status``), as DeepSpeed's read ``ds_status``."""

    def __init__(self, model: nn.Module, only: Callable[[str], bool] = lambda name: True, lag: int = 0) -> None:
        self.full: dict[nn.Parameter, torch.Tensor] = {}
        self.gathered: list[weakref.ref[torch.UntypedStorage]] = []
        self.lag = lag
        self.pending: list[list[Any]] = []  # [module, forwards begun until it is freed]
        for prefix, m in model.named_modules():
            own = [p for n, p in m.named_parameters(recurse=False) if only(f"{prefix}.{n}" if prefix else n)]
            if not own:
                continue
            for p in own:
                self.full[p] = p.detach().clone()
                self._free(p)
            m.register_forward_pre_hook(self._gather)
            m.register_forward_hook(self._release)
            m.register_full_backward_pre_hook(lambda mod, grads: self._gather(mod, ()))

    def _free(self, p: nn.Parameter) -> None:
        p.data = torch.empty(0, dtype=p.dtype)
        p.status = RELEASED  # type: ignore[attr-defined]

    def _gather(self, module: nn.Module, args: Any) -> None:
        if torch._C._current_graph_task_id() == -1:
            for entry in self.pending:
                entry[1] -= 1
            for m, _ in [e for e in self.pending if e[1] <= 0]:
                self._release_now(m)
            self.pending = [e for e in self.pending if e[1] > 0]
        for p in module.parameters(recurse=False):
            if p in self.full and p.status == RELEASED:  # type: ignore[attr-defined]
                p.data = self.full[p].clone()
                p.status = GATHERED  # type: ignore[attr-defined]
                self.gathered.append(weakref.ref(p.untyped_storage()))

    def _release_now(self, module: nn.Module) -> None:
        for p in module.parameters(recurse=False):
            if p in self.full:
                self._free(p)

    def _release(self, module: nn.Module, args: Any, out: Any) -> None:
        if torch._C._current_graph_task_id() != -1:
            return  # a backward's replay keeps them for its ops
        if self.lag:
            self.pending.append([module, self.lag])
        else:
            self._release_now(module)

    def step(self, lr: float = 0.1) -> None:
        """The optimizer on the partition; every parameter freed."""
        with torch.no_grad():
            for p, full in self.full.items():
                if p.grad is not None:
                    full.sub_(lr * p.grad)
                p.grad = None
                self._free(p)
        self.pending.clear()

    def alive(self) -> int:
        return sum(r() is not None for r in self.gathered)


def _train(
    mode: str | None, steps: int = 7, lag: int = 0, only: Callable[[str], bool] = lambda name: True,
    rebind: str | None = None,
) -> tuple[list[list[torch.Tensor]], list[int]]:
    """Per step, every parameter's gradient, and the gathered storages alive when the
    forward returned. ``rebind``: a parameter rebound through ``.data`` between the
    forward and the backward, back after."""
    torch.manual_seed(0)
    model = models.HeadedStack()
    part = _Partitioner(model, only, lag)
    xs = [torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(s)) for s in range(steps)]
    grads: list[list[torch.Tensor]] = []
    alive: list[int] = []
    rt = offrecomp.runtime(model, mode=mode, budget=1 << 16) if mode is not None else None
    with rt if rt is not None else torch.enable_grad():
        for x in xs:
            part.gathered.clear()
            loss = model(x)
            alive.append(part.alive())
            target = model.get_parameter(rebind) if rebind is not None else None
            before = target.data if target is not None else None
            if target is not None:
                target.data = before + 1.0  # type: ignore[operator]
            loss.backward()
            if target is not None:
                target.data = before  # type: ignore[assignment]
            grads.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
            for q in model.parameters():
                if q not in part.full:
                    with torch.no_grad():
                        q.sub_(0.1 * q.grad)  # type: ignore[operator]
                    q.grad = None
            part.step()
    return grads, alive


def _bitwise(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for r, s in zip(a, b) for x, y in zip(r, s))


@pytest.mark.parametrize("lag", [0, 2])
@pytest.mark.parametrize("mode", ["recompute", "auto", "offload", "keep"])
def test_parameters_a_partitioner_releases_are_gathered_by_its_hooks_and_not_held(mode: str, lag: int) -> None:
    """A replay runs with the model's own Parameter objects (the hooks read their
    attributes; a fresh Parameter in a slot has none), gathered by the hooks; the
    gradients are plain's, bitwise; and after the first pass no call holds a gathered
    storage past the forward that plain does not (at the first, the last block's, until
    the backward begins), also where the partitioner frees a block's own parameter once
    the next block's run has begun (``lag``: after that block's entry, so only the
    backward's start sees it), and past the passes a region is looked at in."""
    plain, plain_alive = _train(None, lag=lag)
    got, alive = _train(mode, lag=lag)
    assert _bitwise(plain, got)
    # plain autograd holds each Linear's weight (its matmul saves ``weight.t()``) and
    # those the lag keeps; the first pass also the scales of the blocks freed after the
    # next one's entry: the last one's, and with the lag, those of the lag's blocks
    assert len(set(plain_alive)) == 1 and plain_alive[0] >= 9, plain_alive
    assert alive[0] <= plain_alive[0] + 1 + lag, (alive, plain_alive)
    assert alive[1:] == plain_alive[1:], (alive, plain_alive)


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_parameter_its_region_keeps_gathered_still_replays_a_rebinding_as_read(mode: str) -> None:
    """A region whose own parameter (the block's scale, freed after the region's exit)
    and Linear weights the partitioner frees, and whose other parameters it leaves
    gathered (DeepSpeed keeps small ones so): a ``.data =`` rebinding of one of those
    between the forward and the backward is replayed with the values the forward read,
    as without the partitioner (NOTE [Replay and parameters]); gradients plain's."""
    weights = lambda name: name.endswith(("scale", "fc1.weight", "fc2.weight"))  # noqa: E731
    plain, _ = _train(None, only=weights, rebind="blocks.1.ln.bias")
    got, _ = _train(mode, only=weights, rebind="blocks.1.ln.bias")
    assert _bitwise(plain, got)


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


def test_a_region_is_looked_at_for_freed_parameters_in_its_first_passes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Parameters released by their owner]: the look costs every region call about
    0.1 us a parameter, so a region's calls are looked at in its first RELEASE_LOOKS
    passes, and not after."""
    from offrecomp import params

    looked: list[int] = []

    def count(state: Any, data: Any) -> None:
        looked.append(1)

    monkeypatch.setattr(params, "_let_go", count)
    model = models.HeadedStack()
    per_pass = []
    with offrecomp.runtime(model, mode="recompute"):
        for s in range(params.RELEASE_LOOKS + 3):
            looked.clear()
            model(torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s))).backward()
            per_pass.append(len(looked))
    assert all(n > 0 for n in per_pass[: params.RELEASE_LOOKS]), per_pass
    assert per_pass[params.RELEASE_LOOKS :] == [0, 0, 0], per_pass
