"""Regions discovered, and what mode="recompute" holds with them, on models whose
repeated blocks sit in lists of one (NOTE [Blocks in lists of one] in offrecomp/regions.py)
and on models that hold them otherwise.

    cd REPO && OMP_NUM_THREADS=1 PYTHONPATH=/tmp/probe_regions/site .venv/bin/python docs/results/cpu-2026-12-06k/regions_lists.py

(``PYTHONPATH``: diffusers 0.42.1 installed beside the project, not in it; without it the
diffusers rows are left out.) Per model: the regions ``discover_regions(model, None)``
finds (names with their indices folded into ``*``, and how many), then the activation
peak of a 3-step run under mode="recompute" as a share of mode="keep"'s (the runtime's
books, ``peak_activation_bytes`` of the last step), and whether its gradients equal
plain training's bitwise.
"""

from __future__ import annotations

import collections
import copy
import logging
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path.cwd()))  # the tree to measure: run from its root

import offrecomp
from offrecomp.regions import discover_regions
from tests import models
from tests.helpers import assert_bitwise, train
from tests.offrecomp.test_regions_lists import UNet

warnings.filterwarnings("ignore")


class Bottleneck(nn.Module):
    """torchvision's Bottleneck: 1x1, 3x3, 1x1 convs with BatchNorm, a downsample
    Sequential where the shape changes."""

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """torchvision's ResNet layout: stem, layer1..layer4 (Sequentials of Bottlenecks), head."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), width: int = 4) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width)
        self.relu, self.maxpool = nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        cin = width
        for i, n in enumerate(blocks):
            w = width * 2**i
            layer = [Bottleneck(cin, w, 1 if i == 0 else 2)] + [Bottleneck(4 * w, w) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
            cin = 4 * w
        self.fc = nn.Linear(cin, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(x.mean(dim=(2, 3))).square().mean()


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def diffusers_unet(layers_per_block: int) -> Callable[[], nn.Module] | None:
    try:
        import diffusers
    except ImportError:
        return None
    logging.getLogger("diffusers").setLevel(logging.ERROR)

    class Wrapped(nn.Module):
        """UNet2DConditionModel (a down block with cross attention, a plain one), trained
        on its output's mean square; the text states are made from the latents."""

        def __init__(self) -> None:
            super().__init__()
            self.m = diffusers.UNet2DConditionModel(
                sample_size=16, in_channels=4, out_channels=4, layers_per_block=layers_per_block,
                block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                attention_head_dim=8, norm_num_groups=8,
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ctx = x.flatten(1)[:, :256].reshape(2, 8, 32)
            return self.m(x, torch.tensor([10, 500]), encoder_hidden_states=ctx).sample.pow(2).mean()

    return Wrapped


CASES: dict[str, tuple[Callable[[], nn.Module] | None, Callable[[int], Any]]] = {
    "GPT (ModuleList of 4 blocks)": (lambda: models.GPT(layers=4, p=0.0), lambda s: torch.randint(0, 64, (2, 24), generator=_gen(s))),
    "ResNet (layer1..4 of 2 Bottlenecks)": (ResNet, lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s))),
    "ResNet (layer1..4 of 1 Bottleneck)": (lambda: ResNet((1, 1, 1, 1)), lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s))),
    "UNet-like, layers=1": (lambda: UNet(layers=1), lambda s: torch.randn(2, 3, 8, 8, generator=_gen(s))),
    "UNet-like, layers=2": (lambda: UNet(layers=2), lambda s: torch.randn(2, 3, 8, 8, generator=_gen(s))),
    "UNet-like, every list of one but mid": (
        lambda: UNet(layers=1, up_layers=1), lambda s: torch.randn(2, 3, 8, 8, generator=_gen(s))
    ),
    "UNet-like, nothing repeats": (
        lambda: UNet(layers=1, up_layers=1, mid_layers=0), lambda s: torch.randn(2, 3, 8, 8, generator=_gen(s))
    ),
    "diffusers UNet2DConditionModel, layers_per_block=1": (diffusers_unet(1), lambda s: torch.randn(2, 4, 16, 16, generator=_gen(s))),
    "diffusers UNet2DConditionModel, layers_per_block=2": (diffusers_unet(2), lambda s: torch.randn(2, 4, 16, 16, generator=_gen(s))),
}


def folded(names: list[str]) -> str:
    counts = collections.Counter(re.sub(r"\.\d+(?=\.|$)", ".*", n) for n in names)
    return ", ".join(f"{k} x{v}" for k, v in counts.items()) or "(none)"


def measure(make: Callable[[], nn.Module], batch: Callable[[int], Any]) -> tuple[list[str], int, int, bool]:
    torch.manual_seed(0)
    model = make()
    names = [r.name for r in discover_regions(model, None)]
    ref = train(copy.deepcopy(model), batch, steps=3)
    peaks = {}
    for mode in ("keep", "recompute"):
        m = copy.deepcopy(model)
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
        got = train(m, batch, rt, steps=3)
        peaks[mode] = rt.report().steps[-1].peak_activation_bytes
    try:
        assert_bitwise(ref, got)
        equal = True
    except AssertionError:
        equal = False
    return names, peaks["keep"], peaks["recompute"], equal


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    print(f"offrecomp from {Path(offrecomp.__file__).parent}, torch {torch.__version__}")
    for name, (make, batch) in CASES.items():
        if make is None:
            print(f"\n{name}: left out (diffusers not importable)")
            continue
        names, keep, recompute, equal = measure(make, batch)
        print(f"\n{name}: {len(names)} regions: {folded(names)}")
        print(
            f"  keep {keep:,} B, recompute {recompute:,} B ({recompute / keep:.0%} of keep), "
            f"gradients {'bitwise equal' if equal else 'DIFFER'} to plain training"
        )


if __name__ == "__main__":
    main()
