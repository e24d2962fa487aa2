"""NOTE [Native keep]: region calls the forced keep mode keeps whole save through
autograd's own saved variables, the runtime's hooks off, and are booked as the same call
was when it last ran with the hooks at that signature."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from tests import models
from tests.helpers import assert_bitwise, make, train, twin

BOOKS = ("saved_tensors", "storages", "kept_bytes", "peak_activation_bytes")


class _Probe(nn.Module):
    """A region that notes, at every call, whether a saved-tensor hook pair is on."""

    def __init__(self, inner: nn.Module, seen: list[bool]) -> None:
        super().__init__()
        self.inner = inner
        self.seen = seen

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(tc.top_saved_tensors_hooks() is not None)
        return self.inner(*args, **kwargs)


def _probed_gpt(seen: list[bool]) -> nn.Module:
    torch.manual_seed(0)
    m = models.GPT()
    m.blocks = nn.ModuleList(_Probe(b, seen) for b in m.blocks)
    return m


def _run(m: nn.Module, batch: Any, steps: int, **kw: Any) -> tuple[list[dict[str, torch.Tensor]], list[Any]]:
    rt = offrecomp.runtime(m, mode="keep", regions=[_Probe], **kw)
    out = train(m, batch, rt, steps=steps)
    return out, rt.report().steps


def test_first_pass_hooked_then_native_and_gradients_bitwise() -> None:
    _, batch = make("gpt_dropout")
    seen: list[bool] = []
    m = _probed_gpt(seen)
    ref = train(twin(m), batch, steps=4)
    got, records = _run(m, batch, 4)
    assert_bitwise(ref, got)
    assert [r.phase for r in records] == ["keep"] * 4
    n = len(m.blocks)
    assert seen == [True] * n + [False] * 3 * n
    assert tc.top_saved_tensors_hooks() is None  # the runtime left nothing on the stack


def test_native_calls_are_booked_as_the_hooked_ones() -> None:
    _, batch = make("gpt_dropout")
    seen_native: list[bool] = []
    seen_hooked: list[bool] = []
    explained = []
    records = []
    for seen, native_keep in ((seen_native, True), (seen_hooked, False)):
        m = _probed_gpt(seen)
        # min_bytes splits the storages into small and not: explain() counts both
        rt = offrecomp.runtime(m, mode="keep", regions=[_Probe], native_keep=native_keep, min_bytes=2048)
        train(m, batch, rt, steps=3)
        records.append(rt.report().steps)
        explained.append(rt.explain())
    assert not all(seen_native) and all(seen_hooked)
    native, hooked = records
    for a, b in zip(native, hooked):
        assert [getattr(a, k) for k in BOOKS] == [getattr(b, k) for k in BOOKS]
    assert native[-1].kept_bytes > 0 and native[-1].saved_tensors > 0
    assert explained[0] == explained[1] and "0/0 B          0/0 B          0/0 B" not in explained[0]


def test_a_new_signature_runs_hooked_once() -> None:
    seen: list[bool] = []
    m = _probed_gpt(seen)
    rt = offrecomp.runtime(m, mode="keep", regions=[_Probe])
    n = len(m.blocks)
    with rt:
        for length in (24, 24, 16, 16, 24):
            m(torch.randint(0, 64, (2, length))).backward()
    assert seen == [True] * n + [False] * n + [True] * n + [False] * 2 * n
    recs = rt.report().steps
    assert recs[1].kept_bytes == recs[4].kept_bytes > recs[3].kept_bytes == recs[2].kept_bytes > 0


def test_a_raising_forward_puts_the_hooks_back() -> None:
    seen: list[bool] = []
    m = _probed_gpt(seen)
    fail = {"now": False}

    def pre_hook(mod: nn.Module, args: Any) -> None:
        if fail["now"]:
            raise RuntimeError("boom")

    m.blocks[1].inner.fc2.register_forward_pre_hook(pre_hook)
    rt = offrecomp.runtime(m, mode="keep", regions=[_Probe])
    idx = torch.randint(0, 64, (2, 24))
    with rt:
        m(idx).sum().backward()
        fail["now"] = True
        with pytest.raises(RuntimeError, match="boom"):
            m(idx)
        assert tc.top_saved_tensors_hooks() is not None  # ours, back on
        fail["now"] = False
        m(idx).sum().backward()
        assert seen[-1] is False  # native again
    assert tc.top_saved_tensors_hooks() is None


def test_a_pair_beneath_the_runtime_keeps_the_hooks_on() -> None:
    """Taking the runtime's pair off would hand the call's saves to the pair beneath."""
    seen: list[bool] = []
    m = _probed_gpt(seen)
    under: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        under.append(1)
        return t

    rt = offrecomp.runtime(m, mode="keep", regions=[_Probe])
    idx = torch.randint(0, 64, (2, 24))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), rt:
        for _ in range(3):
            m(idx).sum().backward()
    assert all(seen) and under == []


def test_write_after_save_in_a_native_call_raises_like_plain() -> None:
    class Writes(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.tanh(x)
            z = y * 2
            if torch.is_grad_enabled() and getattr(self, "write", False):
                y.add_(1)  # tanh saved its output
            return z

    m = nn.Sequential(nn.Linear(4, 4), Writes())
    rt = offrecomp.runtime(m, mode="keep", regions=[Writes])
    x = torch.randn(2, 4)
    with rt:
        m(x).sum().backward()  # the hooked pass
        m[1].write = True  # type: ignore[assignment]
        out = m(x).sum()
        assert rt.report().steps[-1].phase == "keep"
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()


def test_other_modes_keep_the_hooks_on() -> None:
    _, batch = make("gpt_dropout")
    for mode in ("offload", "recompute", "auto"):
        seen: list[bool] = []
        m = _probed_gpt(seen)
        train(m, batch, offrecomp.runtime(m, mode=mode, regions=[_Probe], min_bytes=0), steps=3)
        assert seen and all(seen), mode


@pytest.mark.parametrize("case", ["gpt_dropout", "cnn_batchnorm", "kwargs_tuple", "views_inplace", "shared_block"])
def test_every_model_family_books_and_trains_alike(case: str) -> None:
    """Gradient accumulation (two passes a step, the second native), buffers, keyword
    arguments, views and a block shared by two calls: bitwise gradients, and the books of
    a hooked run."""
    model, batch = make(case)
    ref = train(twin(model), batch, steps=3, accumulate=2)
    books = []
    for native_keep in (True, False):
        m = twin(model)
        rt = offrecomp.runtime(m, mode="keep", native_keep=native_keep)
        assert_bitwise(ref, train(m, batch, rt, steps=3, accumulate=2))
        books.append([[getattr(r, k) for k in BOOKS] for r in rt.report().steps])
    assert books[0] == books[1]
