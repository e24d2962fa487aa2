"""Every private torch API offrecomp relies on still exists (fails loudly when one goes)."""

from __future__ import annotations

import torch

from offrecomp import _torch_compat as tc


def test_private_apis_exist() -> None:
    assert issubclass(tc.TorchDispatchMode, object)
    assert tc.current_graph_task_id() == -1
    assert hasattr(torch.autograd.Variable._execution_engine, "queue_callback")
    assert callable(torch._C._autograd._top_saved_tensors_default_hooks)
    assert tc.top_saved_tensors_hooks() is None
    assert hasattr(torch.cuda, "_sleep")
    from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: F401
    from torch.utils._pytree import tree_flatten, tree_map  # noqa: F401


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
