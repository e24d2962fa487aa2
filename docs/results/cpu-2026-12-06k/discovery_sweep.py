"""The regions ``discover_regions(model, None)`` finds, one line per model, for every
architecture the project's sweeps build: the Hugging Face models of
../cpu-2026-12-05/hf_zoo_sweep.py and ../cpu-2026-12-05f/hf_auto_sweep.py (their tiny
configurations, on the CPU), every torchvision classification, detection and
segmentation model and every timm model (default configurations, on the meta device:
discovery reads only the structure), and diffusers' UNets, VAE and transformers.

    cd REPO && OMP_NUM_THREADS=1 PYTHONPATH=/tmp/sweep5c/pkgs:/tmp/probe_regions/site .venv/bin/python docs/results/cpu-2026-12-06k/discovery_sweep.py > OUT

Run on two trees and ``diff`` the outputs: the models whose regions a change of discovery
moves. A model that fails to build prints ``error`` (both trees alike).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

ROOT = Path.cwd()  # the tree to measure: run from its root
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs/results/cpu-2026-12-05"))
sys.path.insert(0, str(ROOT / "docs/results/cpu-2026-12-05b"))
sys.path.insert(0, str(ROOT / "docs/results/cpu-2026-12-05f"))

with contextlib.suppress(ImportError):
    import tv_stubs  # noqa: F401  (torchvision's ops in Python, before transformers imports torchvision)

from offrecomp.regions import discover_regions  # noqa: E402

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _hf() -> Iterator[tuple[str, Callable[[], nn.Module]]]:
    try:
        import hf_auto_sweep
        import hf_zoo_sweep
    except ImportError:
        return
    for name, make in hf_zoo_sweep.ZOO.items():
        yield f"hf:{name}", make
    for mtype, (kind, cname) in sorted(hf_auto_sweep.candidates().items()):
        yield f"hf:{mtype}", lambda m=mtype, k=kind, c=cname: hf_auto_sweep.build(m, k, c)


def _torchvision() -> Iterator[tuple[str, Callable[[], nn.Module]]]:
    try:
        import torchvision
    except ImportError:
        return

    def make(name: str) -> nn.Module:
        try:  # detection and segmentation models fetch a backbone's weights unless told not to
            return torchvision.models.get_model(name, weights=None, weights_backbone=None)
        except TypeError:
            return torchvision.models.get_model(name, weights=None)

    for name in sorted(torchvision.models.list_models()):
        yield f"tv:{name}", lambda n=name: make(n)


def _timm() -> Iterator[tuple[str, Callable[[], nn.Module]]]:
    try:
        import timm
    except ImportError:
        return
    for name in timm.list_models():
        yield f"timm:{name}", lambda n=name: timm.create_model(n, pretrained=False)


def _diffusers() -> Iterator[tuple[str, Callable[[], nn.Module]]]:
    try:
        import diffusers
    except ImportError:
        return
    small = dict(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
    )
    for lpb in (1, 2, 3):
        yield f"diffusers:UNet2DConditionModel small lpb={lpb}", lambda n=lpb: diffusers.UNet2DConditionModel(**small, layers_per_block=n)
    for cls in (
        "UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel", "UNet3DConditionModel",
        "UNetSpatioTemporalConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel",
        "PixArtTransformer2DModel", "DiTTransformer2DModel", "AutoencoderTiny", "VQModel", "UVit2DModel",
    ):
        if hasattr(diffusers, cls):
            yield f"diffusers:{cls} default", lambda c=cls: getattr(diffusers, c)()
            if cls in ("UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel"):
                yield f"diffusers:{cls} lpb=1", lambda c=cls: getattr(diffusers, c)(layers_per_block=1)


@contextlib.contextmanager
def _device(name: str) -> Iterator[None]:
    if name.startswith("hf:"):
        yield
    else:
        with torch.device("meta"):
            yield


def main() -> None:
    torch.set_num_threads(1)
    for source in (_hf, _torchvision, _timm, _diffusers):
        for name, make in source():
            try:
                with _device(name):
                    model = make()
                regions = [r.name for r in discover_regions(model, None)]
            except Exception as exc:  # a model this environment cannot build
                print(f"{name}: error {type(exc).__name__}", flush=True)
                continue
            print(f"{name}: {len(regions)} {' '.join(regions)}", flush=True)


if __name__ == "__main__":
    main()
