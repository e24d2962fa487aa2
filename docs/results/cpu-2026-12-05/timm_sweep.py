"""timm architectures under every zoo variant, gradients compared bitwise with plain
training (tests/helpers.check_variant).

    PYTHONPATH=DIR python docs/results/cpu-2026-12-05/timm_sweep.py [NAME,NAME ...] [VARIANT,VARIANT ...]

DIR holds timm 1.0.29 (``pip install --no-deps --target DIR timm==1.0.29``). timm imports
a few torchvision names at load time, and torchvision does not import beside torch
2.13.0+cpu: where it is missing, this script puts stand-ins for those names in
``sys.modules`` first (FrozenBatchNorm2d, which no model here uses, and names of its data
pipeline). Tiny configurations, 4 steps each, on the CPU; prints PASS/FAIL per model and
variant. ``vit_gc`` and ``resnet26t_gc`` turn on timm's own gradient checkpointing, which
owns their blocks' activations (offrecomp says so once): their ``recompute`` and tight
``auto`` runs find nothing to drop, by design. ``--bf16`` runs every model's forward and
loss under CPU bf16 autocast (../cpu-2026-12-05n).
"""
import enum
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn


def _torchvision_stand_in() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except Exception:
        pass

    class FrozenBatchNorm2d(nn.Module):
        def __init__(self, n: int, eps: float = 1e-5) -> None:
            super().__init__()
            raise NotImplementedError("a stand-in: torchvision is not importable here")

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        NEAREST_EXACT = "nearest-exact"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    def module(name: str, **attrs: object) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        def stand_in(attr: str) -> type:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {})

        m.__getattr__ = stand_in  # type: ignore[method-assign]
        sys.modules[name] = m
        return m

    functional = module("torchvision.transforms.functional", InterpolationMode=InterpolationMode)
    transforms = module("torchvision.transforms", functional=functional, InterpolationMode=InterpolationMode)
    misc = module("torchvision.ops.misc", FrozenBatchNorm2d=FrozenBatchNorm2d)
    ops = module("torchvision.ops", misc=misc)
    module("torchvision", transforms=transforms, ops=ops, datasets=module("torchvision.datasets"),
           utils=module("torchvision.utils"))


_torchvision_stand_in()
import timm  # noqa: E402

from sweep import BF16Autocast, run  # noqa: E402



class Cls(nn.Module):
    """A timm model and a loss on its outputs (a tuple's summed: DeiT's two heads)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.m(x)
        if isinstance(o, (tuple, list)):
            return sum(t.float().pow(2).mean() for t in o)
        return o.float().pow(2).mean()


def _poolformer() -> nn.Module:
    """poolformer_s12 with one block per stage (``layers=`` up to timm 1.0.29, the
    MetaFormer's ``depths=`` after)."""
    try:
        return timm.create_model("poolformer_s12", num_classes=3, layers=(1, 1, 1, 1))
    except TypeError:
        mf = timm.models.metaformer
        return mf.MetaFormer(
            depths=(1, 1, 1, 1), dims=(64, 128, 320, 512), downsample_norm=None, mlp_act=nn.GELU,
            mlp_bias=True, norm_layers=mf.GroupNorm1, layer_scale_init_values=1e-5,
            res_scale_init_values=None, use_mlp_head=False, num_classes=3,
        )


def img(n: int):  # noqa: ANN201
    return lambda s: torch.randn(2, 3, n, n, generator=torch.Generator().manual_seed(1000 + s))


def _gc(m: nn.Module) -> nn.Module:
    m.set_grad_checkpointing(True)
    return m


dp = dict(drop_path_rate=0.1)
Z = {
 "vit": (lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3, **dp), 32),
 "vit_gc": (lambda: _gc(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, num_classes=3)), 32),
 "deit_dist": (lambda: timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3), 32),
 "swin": (lambda: timm.create_model("swin_tiny_patch4_window7_224", img_size=32, window_size=4, depths=(2, 2), num_heads=(2, 4), embed_dim=16, num_classes=3, **dp), 32),
 "convnext": (lambda: timm.create_model("convnext_atto", depths=(1, 1, 2, 1), dims=(8, 16, 24, 32), num_classes=3, **dp), 32),
 "resnet18": (lambda: timm.create_model("resnet18", num_classes=3), 32),
 "resnet26d": (lambda: timm.create_model("resnet26d", num_classes=3, **dp), 32),
 "efficientnet_b0": (lambda: timm.create_model("efficientnet_b0", num_classes=3, **dp), 32),
 "mobilenetv3": (lambda: timm.create_model("mobilenetv3_small_050", num_classes=3), 32),
 "regnety": (lambda: timm.create_model("regnety_002", num_classes=3), 32),
 "densenet": (lambda: timm.create_model("densenet121", num_classes=3, growth_rate=8, block_config=(2, 2, 2, 2)), 32),
 "densenet_me": (lambda: timm.create_model("densenet121", num_classes=3, growth_rate=8, block_config=(2, 2, 2, 2), memory_efficient=True), 32),
 "cait": (lambda: timm.create_model("cait_xxs24_224", img_size=32, patch_size=8, depth=2, num_classes=3), 32),
 "poolformer": (lambda: _poolformer(), 32),
 "maxvit": (lambda: timm.create_model("maxvit_rmlp_pico_rw_256", img_size=64, num_classes=3), 64),
 "coatnet": (lambda: timm.create_model("coatnet_nano_rw_224", img_size=64, num_classes=3), 64),
 "levit": (lambda: timm.create_model("levit_128s", img_size=64, num_classes=3), 64),
 "eva02": (lambda: timm.create_model("eva02_tiny_patch14_224", img_size=28, patch_size=14, depth=2, num_classes=3), 28),
 "ghostnet": (lambda: timm.create_model("ghostnet_100", num_classes=3), 32),
 "nfnet": (lambda: timm.create_model("nfnet_l0", num_classes=3), 32),
 "xcit": (lambda: timm.create_model("xcit_nano_12_p8_224", img_size=32, depth=2, num_classes=3), 32),
 "pit": (lambda: timm.create_model("pit_ti_224", img_size=64, num_classes=3), 64),
 "dla": (lambda: timm.create_model("dla34", num_classes=3), 32),
 "res2net": (lambda: timm.create_model("res2net50_14w_8s", num_classes=3), 32),
 "beit": (lambda: timm.create_model("beit_base_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=4, num_classes=3), 32),
 "hiera": (lambda: timm.create_model("hiera_tiny_224", img_size=64, num_classes=3, embed_dim=16, num_heads=1, stages=(1, 1, 1, 1)), 64),
 "mambaout": (lambda: timm.create_model("mambaout_femto", num_classes=3, depths=(1, 1, 1, 1)), 32),
 "fastvit": (lambda: timm.create_model("fastvit_t8", num_classes=3), 64),
 "mixer": (lambda: timm.models.mlp_mixer.MlpMixer(num_classes=3, img_size=32, patch_size=8, num_blocks=2, embed_dim=32), 32),
 "convmixer": (lambda: timm.models.convmixer.ConvMixer(dim=32, depth=3, kernel_size=3, patch_size=4, num_classes=3), 32),
 "resnest": (lambda: timm.create_model("resnest14d", num_classes=3), 32),
 "sequencer": (lambda: timm.create_model("sequencer2d_s", num_classes=3, layers=(1, 1, 1, 1)), 32),
 "pvt_v2": (lambda: timm.create_model("pvt_v2_b0", num_classes=3, depths=(1, 1, 1, 1)), 64),
 "mobilevit": (lambda: timm.create_model("mobilevit_xxs", num_classes=3), 64),
 "edgenext": (lambda: timm.create_model("edgenext_xx_small", num_classes=3), 64),
 "cspdarknet": (lambda: timm.create_model("cspresnet50", num_classes=3), 64),
 "hgnetv2": (lambda: timm.create_model("hgnetv2_b0", num_classes=3), 64),
 "repvgg": (lambda: timm.create_model("repvgg_a0", num_classes=3), 32),
 "rexnet": (lambda: timm.create_model("rexnet_100", num_classes=3), 32),  # plain training reaches NaN at step 1
 "vovnet": (lambda: timm.create_model("ese_vovnet19b_slim", num_classes=3), 64),
 "twins": (lambda: timm.create_model("twins_pcpvt_small", num_classes=3, depths=(1, 1, 1, 1)), 64),
 "gcvit": (lambda: timm.create_model("gcvit_xxtiny", num_classes=3, img_size=64, window_size=(2, 2, 2, 1)), 64),
 "nest": (lambda: timm.models.nest.Nest(img_size=32, patch_size=4, num_levels=3, embed_dims=(16, 32, 64), num_heads=(1, 2, 4), depths=(1, 1, 1), num_classes=3), 32),
 "tresnet": (lambda: timm.create_model("tresnet_m", num_classes=3), 64),
 "selecsls": (lambda: timm.create_model("selecsls42b", num_classes=3), 32),
 "inception_next": (lambda: timm.create_model("inception_next_atto", num_classes=3), 32),
 "volo": (lambda: timm.models.volo.VOLO(layers=(1, 1, 1, 1), img_size=64, embed_dims=(32, 64, 64, 64), num_heads=(1, 2, 2, 2), num_classes=3), 64),
 "regnetz": (lambda: timm.create_model("regnetz_b16", num_classes=3), 32),
 "resnet26t_gc": (lambda: _gc(timm.create_model("resnet26t", num_classes=3)), 32),
}


def main() -> int:
    bf16 = "--bf16" in sys.argv
    sys.argv = [a for a in sys.argv if a != "--bf16"]
    wrap = BF16Autocast if bf16 else (lambda m: m)
    return run({name: (lambda f=f: wrap(Cls(f()))) for name, (f, _) in Z.items()}, lambda name, model: img(Z[name][1]))


if __name__ == "__main__":
    raise SystemExit(main())
