"""Region discovery and selection."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp.regions import discover_regions
from tests import models
from tests.helpers import assert_bitwise, check_variant, train
from tests.models import Stack


def test_repeated_children_of_modulelist_and_sequential() -> None:
    gpt = models.GPT(layers=3)
    assert [r.name for r in discover_regions(gpt, None)] == ["blocks.0", "blocks.1", "blocks.2"]
    cnn = models.CNN()
    assert [r.name for r in discover_regions(cnn, None)] == [f"features.{i}" for i in range(4)]


def test_regions_never_nest_and_shared_module_is_one_region() -> None:
    shared = models.SharedModel()
    names = [r.name for r in discover_regions(shared, None)]
    assert names == ["blocks.0", "blocks.1"]
    def layer() -> nn.Module:
        return nn.Sequential(nn.Linear(2, 2), nn.Tanh())

    inner = nn.Sequential(nn.Sequential(layer(), layer()), layer())
    assert [r.name for r in discover_regions(inner, None)] == ["0", "1"]


def test_regions_by_type_and_by_filter() -> None:
    gpt = models.GPT(layers=2)
    by_type = discover_regions(gpt, [nn.LayerNorm])
    assert [r.name for r in by_type] == ["blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2", "ln"]
    by_fn = discover_regions(gpt, lambda m, name: name.endswith("fc1"))
    assert [r.name for r in by_fn] == ["blocks.0.fc1", "blocks.1.fc1"]


def test_explicit_regions_matching_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="matched no module"):
        offrecomp.runtime(models.GPT(), regions=[nn.Conv3d])


def test_bad_regions_argument() -> None:
    with pytest.raises(TypeError, match="regions="):
        offrecomp.runtime(models.GPT(), regions=[1, 2])
    with pytest.raises(TypeError, match="raised"):
        offrecomp.runtime(models.GPT(), regions=lambda m, n: 1 / 0)


class _Mlp(nn.Module):
    """Two layers held as attributes: nothing repeats, and no list holds them."""

    def __init__(self, d: int = 16, out: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


def test_model_without_repeated_blocks_warns_and_still_trains(caplog: pytest.LogCaptureFixture) -> None:
    model = _Mlp(8, 1)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    assert "no repeated blocks" in caplog.text
    x = torch.randn(4, 8)
    with rt:
        model(x).sum().backward()
    step = rt.report().steps[0]
    assert step.recomputed_bytes == 0 and step.kept_bytes > 0  # root saves are kept


def test_user_filter_regions_train_bitwise() -> None:
    from tests.helpers import assert_bitwise, make, train, twin

    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=lambda mod, name: name.endswith(("fc1", "ln2")))
    got = train(m, batch, rt)
    assert_bitwise(ref, got)
    assert rt.regions == ["blocks.0.ln2", "blocks.0.fc1", "blocks.1.ln2", "blocks.1.fc1", "blocks.2.ln2", "blocks.2.fc1"]


class _Layers(nn.Module):
    """torchtitan keeps its blocks in an nn.ModuleDict keyed "0", "1", ..."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): models.Block(32, 4, 0.1) for i in range(3)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.layers.values():
            x = blk(x)
        return x.square().mean()


def test_repeated_children_of_a_moduledict() -> None:
    """Blocks in a ModuleDict are regions; models in a ModuleDict are not (their blocks
    are): a ModuleDict's repeated children count only when nothing inside them does."""
    assert [r.name for r in discover_regions(_Layers(), None)] == ["layers.0", "layers.1", "layers.2"]
    both = nn.ModuleDict({"a": models.GPT(layers=2), "b": models.GPT(layers=2)})
    assert [r.name for r in discover_regions(both, None)] == ["a.blocks.0", "a.blocks.1", "b.blocks.0", "b.blocks.1"]
    mixed = nn.ModuleDict({"enc": nn.Linear(2, 2), "dec": nn.LayerNorm(2)})
    assert discover_regions(mixed, None) == []


def test_moduledict_blocks_train_bitwise() -> None:
    from tests.helpers import check_variant

    torch.manual_seed(0)
    rt, _ = check_variant(_Layers(), lambda s: torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s)), "recompute")
    assert rt.regions == ["layers.0", "layers.1", "layers.2"]


class Adaptable(nn.Module):
    """Runs an adapter when one was injected (as LoRA injection adds modules to blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.adapter: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        return h if self.adapter is None else h + self.adapter(h)


def test_modules_added_to_a_block_after_the_runtime_was_built_are_tracked() -> None:
    """Slots are read again at entry: the adapter's BatchNorm statistics are not updated
    twice by replays, and its parameters are tracked like the block's own."""
    torch.manual_seed(0)
    base = Stack([Adaptable() for _ in range(3)])
    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    for model in (base, m):
        torch.manual_seed(1)
        for blk in model.blocks:
            blk.adapter = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))
    batch = lambda s: torch.randn(8, 16, generator=torch.Generator().manual_seed(s))  # noqa: E731
    ref = train(copy.deepcopy(base), batch, steps=2)
    assert_bitwise(ref, train(m, batch, rt, steps=2))
    assert rt.report().steps[-1].replays > 0


def test_argument_flattening_matches_pytree() -> None:
    """The tensors-only fast path gives pytree's leaves and spec; anything else is
    pytree's own answer."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from offrecomp.arguments import _flatten_arguments

    t, u = torch.randn(2), torch.randn(3)
    p = nn.Parameter(torch.randn(1))
    cases = [
        ((t,), {}),
        ((t, u), {}),
        ((), {"x": t, "mask": u}),
        ((t, p), {"b": u, "a": t}),
        ((t, None), {}),
        ((t, 3, "x"), {"flag": True}),
        (([t, u],), {"d": {"k": t}}),
        ((t.as_subclass(torch.Tensor), u), {}),
    ]
    for args, kwargs in cases:
        for _ in range(2):  # the second call reads the cached spec
            flat, spec = _flatten_arguments(args, kwargs)
            ref_flat, ref_spec = tree_flatten((args, kwargs))
            assert spec == ref_spec and len(flat) == len(ref_flat)
            assert all(a is b for a, b in zip(flat, ref_flat))
            back_args, back_kwargs = tree_unflatten(flat, spec)
            assert len(back_args) == len(args) and list(back_kwargs) == list(kwargs)


def test_one_block_held_several_times_is_a_region() -> None:
    """ALBERT's layout, ``nn.ModuleList([block] * n)``: ``children()`` names the block once,
    but it repeats in the list, so it is a region (one, as a shared module is), and
    recompute trains it bitwise."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    model = Stack([block] * 4)

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=2)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(m, batch, rt, steps=2))
    assert rt.regions == ["blocks.0"]
    assert all(s.recomputed_bytes > 0 for s in rt.report().steps)


def test_lists_that_are_never_called_are_not_regions() -> None:
    """x-transformers keeps each layer's norm, block and residual in a ModuleList the
    forward unpacks: those lists repeat but never run, so they are not regions; where
    nothing repeats inside them, their children are (NOTE [Stacks without repeats]) but
    for the norm, one op (NOTE [One-op modules]), or the ones named with regions=."""

    class Layered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                nn.ModuleList([nn.LayerNorm(8), models.MLPBlock(8)]) for _ in range(3)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for norm, block in self.layers:
                x = block(norm(x))
            return x.sum()

    assert [r.name for r in discover_regions(Layered(), None)] == [f"layers.{i}.1" for i in range(3)]
    named = discover_regions(Layered(), lambda m, name: isinstance(m, nn.LayerNorm) and name.endswith(".0"))
    assert [r.name for r in named] == [f"layers.{i}.0" for i in range(3)]


@pytest.mark.parametrize("mode", ["recompute", "auto_tight"])
def test_layers_held_as_dicts_in_a_stack_are_recomputed(mode: str) -> None:
    """rtdl's FT-Transformer keeps each layer's parts by name in a ModuleDict of a
    ModuleList (``blocks[i]["attention"]``), the model's forward calling them: as for a
    ModuleList of ModuleLists, the parts are regions where nothing repeats (NOTE [Stacks
    without repeats]); the model had none, so nothing was recomputed."""

    class ByName(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.ModuleDict({"norm": nn.LayerNorm(16), "attention": _Attention(), "ffn": _FeedForward()})
                for _ in range(3)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b["ffn"](b["attention"](b["norm"](x)))
            return x.square().mean()

    names = [r.name for r in discover_regions(ByName(), None)]
    assert names == [f"blocks.{i}.{p}" for i in range(3) for p in ("attention", "ffn")], names
    torch.manual_seed(0)
    check_variant(ByName(), lambda s: torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(s)), mode)


def test_the_model_as_its_own_region_is_not_taken_for_replaced(caplog: pytest.LogCaptureFixture) -> None:
    """A cell unrolled by the loop, made the one region with ``regions=[its class]``: the
    region named ``<model>`` was looked up by that name at each forward, not found, and
    said replaced (its activations "kept"), though it replays; that warning, once per
    runtime, was then spent."""

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = nn.GRUCell(8, 8)

        def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return self.cell(x, h)

    torch.manual_seed(0)
    m = Cell()
    rt = offrecomp.runtime(m, mode="recompute", regions=[Cell], min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        for _ in range(2):
            h = torch.zeros(2, 8)
            for _ in range(3):
                h = m(torch.randn(2, 8), h)
            h.square().mean().backward()
    assert rt.regions == ["<model>"]
    assert not [r for r in caplog.records if "no longer the model's modules" in r.getMessage()]
    assert rt.report().steps[-1].replays > 0


class _Attention(nn.Module):
    """An attention block: a norm, projections, a Sequential out projection."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Sequential(nn.Linear(d, d), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return x + self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)


class _FeedForward(nn.Module):
    """A feedforward block whose layers are one Sequential: Linear and Dropout repeat."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(2 * d, d), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class _Rearrange(nn.Module):
    """A reshaping layer of a library's own (einops' Rearrange): no children, no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2)


class _ViT(nn.Module):
    """vit-pytorch's layout: layers in a ModuleList of [attention, feedforward] lists
    (no class repeats there), beside a patch embedding and head of one-op layers that do
    repeat (two LayerNorms, two Rearranges), and norms in a list: one of the model's own
    without children (an RMSNorm written with a raw parameter), one of torch's."""

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.g = nn.Parameter(torch.ones(d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * self.g

    def __init__(self, d: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Sequential(_Rearrange(), nn.LayerNorm(d), nn.Linear(d, d), nn.LayerNorm(d), _Rearrange())
        self.layers = nn.ModuleList(nn.ModuleList([_Attention(d), _FeedForward(d)]) for _ in range(depth))
        self.norms = nn.ModuleList([self.RMSNorm(d), nn.LayerNorm(d)])
        self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).transpose(-1, -2)
        for attn, ff in self.layers:
            x = ff(attn(x))
        return self.head(self.norms[1](self.norms[0](x))).square().sum()


def test_modules_of_one_op_are_not_regions() -> None:
    """NOTE [One-op modules]: torch's layers, and torch containers holding just one,
    are never regions; small modules of the model's own (childless, or holding one of
    torch's layers) are not where blocks exist, in Sequentials where they repeat nor in
    lists. The blocks they would crowd out are
    found, and recompute drops and replays them bitwise. torch's recurrent layers and
    attention are blocks; where a model has no blocks, its small modules are its
    regions."""
    vit = _ViT()
    blocks = [f"layers.{i}.{j}" for i in range(3) for j in (0, 1)]
    assert [r.name for r in discover_regions(vit, None)] == blocks
    mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 1))
    assert discover_regions(mlp, None) == []
    norms = nn.ModuleList(nn.Sequential(nn.LayerNorm(4)) for _ in range(3))
    assert discover_regions(norms, None) == []
    rnn = nn.ModuleList([nn.LSTM(4, 4), nn.LSTM(4, 4), nn.Linear(4, 4)])
    assert [r.name for r in discover_regions(rnn, None)] == ["0", "1"]
    gates = nn.ModuleList([nn.GRUCell(4, 4), nn.GRUCell(4, 4)])
    assert [r.name for r in discover_regions(gates, None)] == ["0", "1"]
    attention = nn.ModuleList([nn.MultiheadAttention(4, 2), nn.MultiheadAttention(4, 2), nn.LayerNorm(4)])
    assert [r.name for r in discover_regions(attention, None)] == ["0", "1"]
    leaves = nn.Sequential(_ViT.RMSNorm(4), _ViT.RMSNorm(4), nn.Linear(4, 4))
    assert [r.name for r in discover_regions(leaves, None)] == ["0", "1"]

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 16, 6, generator=torch.Generator().manual_seed(s))

    torch.manual_seed(0)
    ref = train(copy.deepcopy(vit), batch, steps=3)
    rt = offrecomp.runtime(vit, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(vit, batch, rt, steps=3))
    assert all(s.recomputed_bytes > 0 and s.replays == len(blocks) for s in rt.report().steps)


class _Stacked(nn.Module):
    """Layers held in an nn.ModuleList, none of whose classes repeat: one layer (a model
    configured with one), unlike layers (a small hybrid), or one layer group called
    ``calls`` times (ALBERT's shared group)."""

    def __init__(self, layers: list[nn.Module], calls: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.calls = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.calls):
            for layer in self.layers:
                x = layer(x)
        return x.square().sum()


def test_stacks_without_repeats_are_regions_where_nothing_repeats() -> None:
    """NOTE [Stacks without repeats]: the children of a ModuleList are regions where no
    block repeats anywhere, the outermost ones; a Sequential without repeats (a wrapper
    around a whole model) is not, nor is a ModuleList beside repeated blocks."""
    assert [r.name for r in discover_regions(_Stacked([_Mlp()]), None)] == ["layers.0"]
    unlike = _Stacked([_Mlp(), models.MLPBlock(16), nn.GRU(16, 16)])
    assert [r.name for r in discover_regions(unlike, None)] == ["layers.0", "layers.1", "layers.2"]
    nested = _Stacked([_Stacked([_Mlp()])])
    assert [r.name for r in discover_regions(nested, None)] == ["layers.0"]
    assert discover_regions(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh())), None) == []
    beside = nn.ModuleDict({"gpt": models.GPT(layers=2), "heads": nn.ModuleList([nn.Linear(4, 4), nn.Tanh()])})
    assert [r.name for r in discover_regions(beside, None)] == ["gpt.blocks.0", "gpt.blocks.1"]



def test_unlike_layers_beside_repeated_ones_in_a_stack_are_regions() -> None:
    """NOTE [Stacks without repeats]: a hybrid configured with few layers holds one layer
    of a class among repeated ones (Zamba2's hybrid layer among its Mamba layers): it is a
    region too, and recomputed, unless regions lie inside it (outermost wins only over
    what it holds) or it is one op."""
    hybrid = _Stacked([_Mlp(), _Mlp(), models.MLPBlock(16), _Mlp()])
    assert [r.name for r in discover_regions(hybrid, None)] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    holder = _Stacked([_Mlp(), _Mlp(), _Stacked([_Mlp(), _Mlp()]), nn.Linear(16, 16)])
    assert [r.name for r in discover_regions(holder, None)] == ["layers.0", "layers.1", "layers.2.layers.0", "layers.2.layers.1"]

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    torch.manual_seed(0)
    ref = train(copy.deepcopy(hybrid), batch, steps=3)
    rt = offrecomp.runtime(hybrid, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(hybrid, batch, rt, steps=3))
    assert all(s.replays == 4 for s in rt.report().steps)


class _Stage(nn.Module):
    """Blocks held as attributes (timm's RegStage: b1, b2, ...), no container."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.b1 = models.MLPBlock(d)
        self.b2 = models.MLPBlock(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b2(self.b1(x))


class _Staged(nn.Module):
    """Stages held as attributes (timm's RegNet: s1..s4), a head of two Linear layers,
    and two activation modules of a user class without children."""

    class Act(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x)

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.s1, self.s2 = _Stage(d), _Stage(d)
        self.a1, self.a2 = self.Act(), self.Act()
        self.fc1, self.fc2 = nn.Linear(d, d), nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.a2(self.fc1(self.a1(self.s2(self.s1(x)))))).square().sum()


def test_blocks_held_as_attributes_are_regions_where_no_container_holds_any() -> None:
    """NOTE [Blocks held as attributes]: same-class sibling blocks (torch's Sequentials
    too), outermost first; torch's own layers and childless modules are never regions
    this way, and a container's repeated children win over attributes."""
    assert [r.name for r in discover_regions(_Staged(), None)] == ["s1", "s2"]
    assert [r.name for r in discover_regions(_Stage(), None)] == ["b1", "b2"]
    assert discover_regions(_Mlp(), None) == []  # two nn.Linear siblings
    stages = nn.Module()  # a ResNet with one block per stage: Sequential stages
    stages.layer1, stages.layer2 = nn.Sequential(models.MLPBlock(16)), nn.Sequential(models.MLPBlock(16))
    assert [r.name for r in discover_regions(stages, None)] == ["layer1", "layer2"]
    beside = nn.ModuleDict({"staged": _Staged(), "stack": Stack([models.MLPBlock(16) for _ in range(2)])})
    assert [r.name for r in discover_regions(beside, None)] == ["stack.blocks.0", "stack.blocks.1"]
    compiled = _Staged()
    compiled.s1, compiled.s2 = torch.compile(compiled.s1), torch.compile(compiled.s2)  # type: ignore[assignment]
    assert [r.name for r in discover_regions(compiled, None)] == ["s1", "s2"]


def _recomputed_bitwise(model: nn.Module, mode: str, replays: int) -> offrecomp.Runtime:
    """Train ``model`` (4 x 16 inputs) plainly and under ``mode`` (auto at a budget that
    drops all it can): bitwise equal, the last step replaying ``replays`` region calls."""

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=4)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **({"budget": 1} if mode == "auto" else {}))
    assert_bitwise(ref, train(m, batch, rt, steps=4))
    last = rt.report().steps[-1]
    assert last.recomputed_bytes > 0 and last.replays == replays, (last.recomputed_bytes, last.replays)
    return rt


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_blocks_held_as_attributes_are_recomputed_bitwise(mode: str) -> None:
    torch.manual_seed(0)
    assert _recomputed_bitwise(_Staged(), mode, replays=2).regions == ["s1", "s2"]


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_lone_layer_group_called_once_per_layer_is_recomputed(mode: str) -> None:
    """ALBERT's default layout: one layer group in a ModuleList, called once per layer.
    It is the region, each call a region call, dropped and replayed bitwise. Auto's most
    frugal plan keeps the last call whole: its replay, at the backward's start, would
    hold the up projection's output beside the tanh's it brings back (NOTE [Replay
    transients] in scheduler/working_set.py)."""
    torch.manual_seed(0)
    replays = 4 if mode == "recompute" else 3
    assert _recomputed_bitwise(_Stacked([_Mlp()], calls=4), mode, replays=replays).regions == ["layers.0"]


class _LazyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.LazyLinear(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload", "auto"])
def test_lazy_modules_materialised_by_the_first_training_step(mode: str) -> None:
    """The first step's forward makes the lazy parameters: nothing reads one before
    (the offload path looks up the parameters' storages at a leaf's save), and training
    is bitwise a plain run's; the later steps recompute or offload."""
    torch.manual_seed(0)
    model = models.Stack([_LazyBlock() for _ in range(3)])
    ref = train(copy.deepcopy(model), _lazy_batch, steps=4)
    rt = offrecomp.runtime(model, mode=mode, min_bytes=0)
    assert_bitwise(ref, train(model, _lazy_batch, rt, steps=4))
    steps = rt.report().steps
    last = steps[-1]
    if mode == "keep":
        assert last.kept_bytes > 0 and last.recomputed_bytes == last.offloaded_bytes == 0
    elif mode == "auto":
        # no budget: the plan keeps, after its calibration replayed the materialised blocks
        assert last.phase == "planned" and last.kept_bytes > 0, steps
        assert any(s.phase == "calibrate" and s.replays == 3 and s.recomputed_bytes > 0 for s in steps), steps
    else:
        assert {"recompute": last.recomputed_bytes, "offload": last.offloaded_bytes}[mode] > 0


def _lazy_batch(s: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_lazy_modules_materialised_by_a_forward_inside_the_runtime(mode: str) -> None:
    """A dry-run forward with grad materialises LazyLinear parameters inside the
    runtime: nothing reads an uninitialised parameter, and materialising them is not
    taken for a forward writing its parameters (the blocks recompute afterwards)."""
    LazyBlock = _LazyBlock
    torch.manual_seed(0)
    m = models.Stack([LazyBlock() for _ in range(2)])
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None)
    with rt:
        m(torch.zeros(1, 16))
        for s in range(4):
            m(torch.randn(4, 16, generator=torch.Generator().manual_seed(s))).backward()
    assert all(p.grad is not None for p in m.parameters())
    assert rt.report().steps[-1].recomputed_bytes > 0
