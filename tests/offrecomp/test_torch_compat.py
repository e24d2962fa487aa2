"""Every private torch API offrecomp relies on still exists (fails loudly when one goes)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import offrecomp
from offrecomp import _torch_compat as tc


def test_private_apis_exist() -> None:
    assert issubclass(tc.TorchDispatchMode, object)
    assert tc.current_graph_task_id() == -1
    assert hasattr(torch.autograd.Variable._execution_engine, "queue_callback")
    assert callable(torch._C._autograd._top_saved_tensors_default_hooks)
    assert tc.top_saved_tensors_hooks() is None
    pair = (lambda t: t, lambda t: t)
    tc.push_saved_tensors_hooks(*pair)
    assert tc.top_saved_tensors_hooks() == pair
    tc.pop_saved_tensors_hooks()
    assert tc.top_saved_tensors_hooks() is None
    assert hasattr(torch.cuda, "_sleep")
    assert all(tc.tensor_base_method(n) is getattr(torch._C.TensorBase, n) for n in ("tolist", "numpy"))
    from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: F401
    assert tc.graph_task_id() == -1
    assert tc._TF_API and tc.torch_function_state() is None
    with torch._C.DisableTorchFunctionSubclass():  # what ``_is_torch_function_enabled`` tells apart
        assert tc.torch_function_state() == (torch._C._TorchFunctionState.SUBCLASSES_DISABLED, ())
    leaves, spec = tc.tree_flatten(((1, 2), {"a": 3}))
    assert tc.tree_unflatten(leaves, spec) == ((1, 2), {"a": 3}) and isinstance(spec, tc.TreeSpec)
    assert tc.tree_leaves([1, (2,)]) == [1, 2]
    dst = [torch.zeros(3), torch.zeros(2)]
    tc.foreach_copy_(dst, [torch.ones(3), torch.full((2,), 2.0)])
    assert dst[0].tolist() == [1, 1, 1] and dst[1].tolist() == [2, 2]
    tc.host_empty_cache()  # a no-op without CUDA, never an error
    storage = torch.UntypedStorage(8)
    assert tc.storage_use_count(storage) == 1
    view = torch.empty(0, dtype=torch.uint8).set_(storage)
    alias = view.data
    assert tc.storage_use_count(storage) == 3  # the storage object and each tensor
    assert tc.storage_object_refs(storage) == 1  # this frame's; tensors on it add none
    held = alias.untyped_storage()
    assert held is storage and tc.storage_object_refs(storage) == 2
    del view, alias, held
    assert tc.storage_use_count(storage) == 1 and tc.storage_object_refs(storage) == 1
    assert tc.eval_frame_callback_getter() is not None
    from torch._dynamo.comptime import comptime  # noqa: F401  (at_trace_time)
    heard: list[Any] = []
    tc.route_version_increments(lambda ts: (heard.append(ts), tc.VERSION_INCREMENT(ts)))
    try:
        t = torch.zeros(2)
        torch.autograd.graph.increment_version(t)  # what AOT autograd calls for inputs its kernels wrote
    finally:
        tc.route_version_increments(None)
    assert len(heard) == 1 and t._version == 1 and torch._C._increment_version is tc.VERSION_INCREMENT
    m = torch.nn.Linear(2, 2)
    assert hasattr(m, tc.COMPILED_CALL_IMPL) and getattr(m, tc.COMPILED_CALL_IMPL) is None
    m.compile()
    assert getattr(m, tc.COMPILED_CALL_IMPL) is not None
    assert tc.is_optimized_module(torch.compile(torch.nn.Linear(2, 2))) and not tc.is_optimized_module(m)


def test_no_private_torch_api_outside_the_compat_module() -> None:
    """Every private torch name offrecomp reaches goes through _torch_compat.py."""
    import pathlib
    import re

    root = pathlib.Path(tc.__file__).parent
    pattern = re.compile(r"torch\._C\b|torch\._dynamo|torch\._foreach|torch\.utils\._|_compiled_call_impl\b")
    paths = sorted(root.rglob("*.py"))
    assert root / "trace" / "recorder.py" in paths  # the subpackages are scanned too
    found = [
        f"{path.relative_to(root)}:{i}: {line.strip()}"
        for path in paths
        if path.name != "_torch_compat.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0]) and not line.lstrip().startswith(('"', "'"))
    ]
    assert not found, found


def test_a_refused_hooks_disable_is_told_from_an_error_in_its_section() -> None:
    """``refused_hooks_disable``: torch refusing to enter the section (a pair registered)
    is told by the section's own frame; an error raised in the section's body, with the
    same message, is not."""
    with (
        pytest.raises(RuntimeError, match=r"^section$") as refused,
        torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
        torch.autograd.graph.disable_saved_tensors_hooks("section"),
    ):
        pass
    with pytest.raises(RuntimeError, match=r"^section$") as inside, torch.autograd.graph.disable_saved_tensors_hooks("section"):
        assert tc.saved_tensors_hooks_disabled() == "section"
        raise RuntimeError("section")
    assert tc.refused_hooks_disable(refused.value) and not tc.refused_hooks_disable(inside.value)
    assert tc.saved_tensors_hooks_disabled() is None


def test_schema_introspection() -> None:
    aten = torch.ops.aten
    assert tc.op_writes_inputs(aten.add_.Tensor)
    assert not tc.op_writes_inputs(aten.add.Tensor)
    assert tc.op_returns_alias(aten.view.default)
    assert not tc.op_returns_alias(aten.mm.default)
    assert tc.is_nondeterministic_seeded(aten.native_dropout.default)
    assert not tc.is_nondeterministic_seeded(aten.mm.default)
    assert tc.written_arg_names(aten.addmm.out) == ("out",)


def test_storage_objects_are_preserved() -> None:
    """Replay identity relies on one Python storage object per live allocation."""
    import weakref

    t = torch.randn(100)
    w = weakref.ref(t.untyped_storage())
    assert w() is t.untyped_storage()
    v = t[10:]
    del t
    assert w() is not None and w() is v.untyped_storage()


def test_callback_only_inside_backward() -> None:
    seen = []
    x = torch.randn(3, requires_grad=True)

    def hook(g: torch.Tensor) -> torch.Tensor:
        assert tc.current_graph_task_id() != -1
        tc.queue_backward_callback(lambda: seen.append(1))
        return g

    y = x * 2
    y.register_hook(hook)
    y.sum().backward()
    assert seen == [1]



def test_a_saved_slot_says_whether_a_hook_took_it() -> None:
    """The hidden-save check tells a slot a hook took from an empty one and from a
    wrapped number autograd saved past every hook, without unpacking any."""
    x = torch.randn(3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        scaled = x * 2.5  # saves the wrapped 2.5 without hooks, and no `self` slot
        squared = x * x  # both slots through the hooks
    fn = scaled.grad_fn
    assert not tc.saved_slot_hooked(fn._raw_saved_other)
    assert not tc.saved_slot_hooked(fn._raw_saved_self)
    assert tc.saved_slot_hooked(squared.grad_fn._raw_saved_self)
    assert tc.saved_slot_hooked(squared.grad_fn._raw_saved_other)
    (scaled.sum() + squared.sum()).backward()
    assert torch.equal(x.grad, 2.5 + 2 * x.detach())


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_backward_entry_and_its_arguments() -> None:
    """``backward`` and ``grad`` go through ``backward_entry()``, with create_graph where
    ``backward_creates_graph`` reads it and accumulate_grad where ``backward_accumulates``
    does (NOTE [Hooks off in backward])."""
    original = tc.backward_entry()
    seen: list[bool] = []
    accumulates: list[bool] = []

    def spy(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(tc.backward_creates_graph(args, kwargs))
        accumulates.append(tc.backward_accumulates(args, kwargs))
        return original(outputs, *args, **kwargs)

    x = torch.ones(3, requires_grad=True)
    tc.set_backward_entry(spy)
    try:
        x.pow(2).sum().backward()
        torch.autograd.grad(x.pow(2).sum(), x)
        torch.autograd.grad(x.pow(2).sum(), x, create_graph=True)
        torch.autograd.backward(x.pow(2).sum(), inputs=[x], create_graph=True)
    finally:
        tc.set_backward_entry(original)
    assert seen == [False, False, True, True]
    assert accumulates == [True, False, False, True]
    # positionally, and anything but a bool False reads as accumulating
    assert not tc.backward_accumulates((None, False, False, (), True, False), {})
    assert tc.backward_accumulates((None, False, False, (), True, True), {})
    assert tc.backward_accumulates((None, False, False, (), True, None), {})
    assert tc.backward_accumulates((None, False, False), {})


def test_version_of_reads_inference_tensors() -> None:
    """NOTE [Inference tensors]: ``_version`` raises on one made under inference mode;
    ``version_of`` gives the constant, and the counter of everything else."""
    t = torch.zeros(3)
    t.add_(1)
    assert tc.version_of(t) == t._version == 1
    with torch.inference_mode():
        inf = torch.zeros(3)
    with pytest.raises(RuntimeError, match="version counter"):
        inf._version  # noqa: B018
    assert tc.version_of(inf) == tc.INFERENCE_VERSION
    alias = inf.detach()  # outside inference mode: a counter of its own
    assert tc.version_of(alias) == 0


def test_collective_sequence_is_zero_without_a_process_group() -> None:
    """NOTE [Collective regions]: read at region calls of a distributed run only; without
    a process group it reads 0 (the two-rank test reads it move)."""
    assert tc.collective_sequence() == 0


@pytest.mark.parametrize("version", ["2.7.1", "2.9.1+cu128"])
def test_a_torch_older_than_the_oldest_supported_is_named(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"needs torch>=2\.10 .*found torch {re.escape(version)}"):
        offrecomp.runtime(torch.nn.Linear(2, 2))
    offrecomp.runtime(torch.nn.Linear(2, 2), mode="off")  # nothing to run: no check


@pytest.mark.parametrize("version", ["2.10.0", "2.15.0+cu132", "2.11.0a0+git1234", "2.13.0.dev20260101", "local"])
def test_supported_and_unparsed_torch_versions_pass(version: str) -> None:
    tc.check_torch_version(version)
