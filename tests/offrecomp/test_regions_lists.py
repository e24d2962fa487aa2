"""Region discovery where a model's blocks sit in lists of one (NOTE [Blocks in lists of
one] in offrecomp/regions.py): a UNet's down blocks, each a class of its own, holding
one residual block and one attention block each."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp.regions import discover_regions
from tests import models
from tests.helpers import assert_bitwise, train


class Res(nn.Module):
    """A residual block with a time embedding (diffusers' ResnetBlock2D)."""

    def __init__(self, cin: int, cout: int, temb: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time_proj(F.silu(t))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.shortcut is None else self.shortcut(x)) + h


class Attn(nn.Module):
    """Self-attention over an image's pixels (diffusers' Transformer2DModel)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, c)
        self.qkv = nn.Linear(c, 3 * c)
        self.out = nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v)
        return x + self.out(a).transpose(1, 2).reshape(b, c, hh, ww)


class Down(nn.Module):
    """``layers`` residual blocks (with attention after each where ``attn``), then a
    strided conv where ``down``: diffusers' DownBlock2D and CrossAttnDownBlock2D as two
    classes. Returns its output and the features its up block joins."""

    def __init__(self, cin: int, cout: int, layers: int, attn: bool, down: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(Res(cin if i == 0 else cout, cout) for i in range(layers))
        self.attentions = nn.ModuleList(Attn(cout) for _ in range(layers if attn else 0))
        self.downsamplers = nn.ModuleList([nn.Conv2d(cout, cout, 3, stride=2, padding=1)] if down else [])

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        skips = []
        for i, res in enumerate(self.resnets):
            x = res(x, t)
            if len(self.attentions):
                x = self.attentions[i](x)
            skips.append(x)
        if len(self.downsamplers):
            x = self.downsamplers[0](x)
            skips.append(x)
        return x, skips


class AttnDown(Down):
    def __init__(self, cin: int, cout: int, layers: int) -> None:
        super().__init__(cin, cout, layers, attn=True, down=True)


class PlainDown(Down):
    def __init__(self, cin: int, cout: int, layers: int) -> None:
        super().__init__(cin, cout, layers, attn=False, down=False)


class Up(nn.Module):
    """``layers`` residual blocks, each on the features joined with a skip, then (where
    ``up``) an upsampling conv (diffusers' UpBlock2D, CrossAttnUpBlock2D)."""

    def __init__(self, cin: int, skip_cs: list[int], cout: int, attn: bool, up: bool) -> None:
        super().__init__()
        layers = len(skip_cs)
        self.resnets = nn.ModuleList(Res((cin if i == 0 else cout) + skip_cs[i], cout) for i in range(layers))
        self.attentions = nn.ModuleList(Attn(cout) for _ in range(layers if attn else 0))
        self.upsamplers = nn.ModuleList([nn.Conv2d(cout, cout, 3, padding=1)] if up else [])

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor], t: torch.Tensor) -> torch.Tensor:
        for i, res in enumerate(self.resnets):
            x = res(torch.cat([x, skips[i]], dim=1), t)
            if len(self.attentions):
                x = self.attentions[i](x)
        if len(self.upsamplers):
            x = self.upsamplers[0](F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return x


class PlainUp(Up):
    def __init__(self, cin: int, skip_cs: list[int], cout: int) -> None:
        super().__init__(cin, skip_cs, cout, attn=False, up=True)


class AttnUp(Up):
    def __init__(self, cin: int, skip_cs: list[int], cout: int) -> None:
        super().__init__(cin, skip_cs, cout, attn=True, up=False)


class Mid(nn.Module):
    def __init__(self, c: int, layers: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(Res(c, c) for _ in range(layers + 1))
        self.attentions = nn.ModuleList(Attn(c) for _ in range(layers))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x, t)
        for attn, res in zip(self.attentions, self.resnets[1:]):
            x = res(attn(x), t)
        return x


class UNet(nn.Module):
    """A UNet laid out as diffusers' UNet2DConditionModel: a down block with attention
    and a plain one (two classes), ``layers`` residual blocks in each down block's list
    and ``up_layers`` (``layers + 1`` by default, as diffusers') in each up block's, a
    mid block of ``mid_layers + 1`` residual and ``mid_layers`` attention blocks, and a
    time embedding MLP."""

    def __init__(self, layers: int = 1, up_layers: int | None = None, mid_layers: int = 1, c: int = 8) -> None:
        super().__init__()
        self.up_layers = layers + 1 if up_layers is None else up_layers
        assert 1 <= self.up_layers <= layers + 1
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.time_embedding = nn.Sequential(nn.Linear(1, 16), nn.SiLU(), nn.Linear(16, 16))
        self.down_blocks = nn.ModuleList([AttnDown(c, c, layers), PlainDown(c, 2 * c, layers)])
        self.mid_block = Mid(2 * c, mid_layers)
        # the features each up block joins, last made first: at half size the down
        # sample's and the plain down block's; at full size conv_in's and the first's
        half, full = ([2 * c] * layers + [c])[: self.up_layers], [c] * self.up_layers
        self.up_blocks = nn.ModuleList([PlainUp(2 * c, half, 2 * c), AttnUp(2 * c, full, c)])
        self.norm_out = nn.GroupNorm(4, c)
        self.conv_out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.time_embedding(x.mean(dim=(1, 2, 3))[:, None])
        h = self.conv_in(x)
        full = [h]
        h, skips = self.down_blocks[0](h, t)
        full, half = full + skips[:-1], skips[-1:]
        h, skips = self.down_blocks[1](h, t)
        half += skips
        h = self.mid_block(h, t)
        h = self.up_blocks[0](h, half[::-1][: self.up_layers], t)
        h = self.up_blocks[1](h, full[::-1][: self.up_layers], t)
        return self.conv_out(F.silu(self.norm_out(h))).square().mean()


def _images(s: int) -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(s))


def _tree(names: list[str]) -> None:
    """No region lies inside another."""
    assert not [a for a in names for b in names if a != b and a.startswith(b + ".")], names


def test_blocks_in_lists_of_one_are_regions_beside_their_repeats() -> None:
    """NOTE [Blocks in lists of one]: the down blocks' residual and attention blocks, one
    in each list, and the mid block's one attention block, are regions as the same
    classes repeated in the up blocks' lists are; the time embedding, the strided and
    upsampling convs, the norm and the output conv are not."""
    names = [r.name for r in discover_regions(UNet(layers=1), None)]
    assert names == [
        "down_blocks.0.resnets.0", "down_blocks.0.attentions.0", "down_blocks.1.resnets.0",
        "mid_block.resnets.0", "mid_block.resnets.1", "mid_block.attentions.0",
        "up_blocks.0.resnets.0", "up_blocks.0.resnets.1",
        "up_blocks.1.resnets.0", "up_blocks.1.resnets.1", "up_blocks.1.attentions.0", "up_blocks.1.attentions.1",
    ]
    # every list of one but the mid block's residual pair: the classes repeat there only
    names = [r.name for r in discover_regions(UNet(layers=1, up_layers=1), None)]
    assert names == [
        "down_blocks.0.resnets.0", "down_blocks.0.attentions.0", "down_blocks.1.resnets.0",
        "mid_block.resnets.0", "mid_block.resnets.1", "mid_block.attentions.0",
        "up_blocks.0.resnets.0", "up_blocks.1.resnets.0", "up_blocks.1.attentions.0",
    ]
    two = [r.name for r in discover_regions(UNet(layers=2), None)]
    assert len(two) == 18 and "mid_block.attentions.0" in two
    _tree(two)


def test_without_repeats_lists_of_one_stay_stacks() -> None:
    """Where no class repeats among its siblings anywhere, the children of every
    ModuleList are regions as before, the outermost (NOTE [Stacks without repeats])."""
    names = [r.name for r in discover_regions(UNet(layers=1, up_layers=1, mid_layers=0), None)]
    assert names == ["down_blocks.0", "down_blocks.1", "mid_block.resnets.0", "up_blocks.0", "up_blocks.1"]


class _Holder(nn.Module):
    """A block around a list of one block, or of two (a stage of repeated blocks)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(models.MLPBlock(16) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class _Head(nn.Module):
    """One Linear of the model's own (a small module, not a block)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))


class _Lists(nn.Module):
    """Repeated blocks in one list, and lists of one: blocks around a list of one block,
    stages of two blocks, Linear layers, norms, embeddings and small heads."""

    def __init__(self) -> None:
        super().__init__()
        self.rep = nn.ModuleList([models.MLPBlock(16), models.MLPBlock(16)])
        self.a, self.b = nn.ModuleList([_Holder(1)]), nn.ModuleList([_Holder(1)])
        self.c, self.d = nn.ModuleList([_Holder(2)]), nn.ModuleList([_Holder(2)])
        self.fc1, self.fc2 = nn.ModuleList([nn.Linear(16, 16)]), nn.ModuleList([nn.Linear(16, 16)])
        self.ln1, self.ln2 = nn.ModuleList([nn.LayerNorm(16)]), nn.ModuleList([nn.LayerNorm(16)])
        self.emb1, self.emb2 = nn.ModuleList([nn.Embedding(4, 16)]), nn.ModuleList([nn.Embedding(4, 16)])
        self.h1, self.h2 = nn.ModuleList([_Head()]), nn.ModuleList([_Head()])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb1[0](idx) + self.emb2[0](idx)
        for m in (*self.rep, self.a[0], self.b[0], self.c[0], self.d[0], self.fc1[0], self.ln1[0], self.h1[0]):
            x = m(x)
        return (self.h2[0](self.ln2[0](self.fc2[0](x)))).square().mean()


def test_lists_of_one_hold_blocks_only_and_never_nest() -> None:
    """NOTE [Blocks in lists of one]: a block around a list of one block is the region
    (outermost); one around repeated blocks is not (they are); Linear layers, norms,
    embeddings and small modules in lists of one are never regions."""
    names = [r.name for r in discover_regions(_Lists(), None)]
    assert names == [
        "rep.0", "rep.1", "a.0", "b.0",
        "c.0.blocks.0", "c.0.blocks.1", "d.0.blocks.0", "d.0.blocks.1",
    ]
    model = _Lists()

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 4, (4, 6), generator=torch.Generator().manual_seed(s))

    torch.manual_seed(0)
    ref = train(copy.deepcopy(model), batch, steps=3)
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(model, batch, rt, steps=3))
    assert all(s.replays == len(names) for s in rt.report().steps)


def test_unet_with_lists_of_one_is_recomputed_bitwise() -> None:
    """All twelve regions of the UNet with one block per down list replay bitwise, and
    recompute holds under 40% of keep's activations (55% with the down blocks' and the
    mid block's attention kept whole)."""
    torch.manual_seed(0)
    model = UNet(layers=1)
    ref = train(copy.deepcopy(model), _images, steps=3)
    peaks = {}
    for mode in ("keep", "recompute"):
        m = copy.deepcopy(model)
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
        got = train(m, _images, rt, steps=3)
        assert_bitwise(ref, got)
        peaks[mode] = rt.report().steps[-1].peak_activation_bytes
    assert all(s.replays == 12 for s in rt.report().steps)
    assert peaks["recompute"] < 0.4 * peaks["keep"], peaks
