"""torchvision and torchaudio models under every zoo variant, gradients compared bitwise with
plain training (tests/helpers.check_variant, through ../cpu-2026-12-05/sweep.py).

    PYTHONPATH=DIR python docs/results/cpu-2026-12-05b/vision_audio_sweep.py [NAME,NAME ...] [VARIANT,VARIANT ...]

DIR holds torchvision 0.28.0 and torchaudio 2.11.1, set up as tv_stubs.py says. Tiny
configurations, 4 steps each, on the CPU; prints PASS/FAIL per model and variant.

What the models bring: detection models take a list of images and a list of target
dicts, sample proposals with torch.randperm inside the forward, and return a dict of
losses; Mask R-CNN and Keypoint R-CNN run RoIAlign heads; RAFT calls one update block
a dozen times per forward (a region called repeatedly within a step); the segmentation
models return dicts; GoogLeNet and Inception return auxiliary logits in training; the
audio models take waveforms or features with lengths, and RNN-T takes targets too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import tv_stubs  # noqa: F401  (before torchvision)

# isort: split

import torch
import torchaudio
import torchvision
from sweep import run
from torch import nn
from torchvision.models import detection, optical_flow, segmentation, video

tv = torchvision.models
ta = torchaudio.models


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(o: Any) -> torch.Tensor:
    """A scalar from any output: over the finite elements of each tensor (HuBERT's logits
    hold -inf), the mean square plus a fixed weighting; containers summed."""
    if isinstance(o, torch.Tensor):
        if not o.is_floating_point():
            return torch.zeros(())
        x = o.float()
        x = x[x.isfinite()]
        # a fixed weighting too: a normalised output's mean square is the same for any input
        w = torch.arange(x.numel(), dtype=x.dtype).sin()
        return (x.pow(2).sum() + (x * w).sum()) / max(1, x.numel())
    if isinstance(o, dict):
        return sum((_loss(v) for v in o.values()), torch.zeros(()))
    if isinstance(o, (tuple, list)):
        return sum((_loss(v) for v in o), torch.zeros(()))
    if hasattr(o, "_fields") or hasattr(o, "logits"):  # named tuples, InceptionOutputs
        return sum((_loss(v) for v in tuple(o)), torch.zeros(()))
    return torch.zeros(())


class Loss(nn.Module):
    """A model called on a batch (a tensor, or a tuple of positional arguments), and a loss
    on whatever it returns (a detection model's loss dict is summed as it is)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, batch: Any) -> torch.Tensor:
        return _loss(self.m(*batch) if isinstance(batch, tuple) else self.m(batch))


def img(n: int, c: int = 3, b: int = 2) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(b, c, n, n, generator=_gen(s))


def clip(n: int, t: int = 4, b: int = 1) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(b, 3, t, n, n, generator=_gen(s))


def det_batch(masks: bool = False, keypoints: bool = False) -> Callable[[int], tuple[Any, ...]]:
    def batch(s: int) -> tuple[Any, ...]:
        g = _gen(s)
        images, targets = [], []
        for h, w in ((64, 64), (48, 64)):
            images.append(torch.rand(3, h, w, generator=g))
            x0, y0 = float(torch.randint(0, 16, (), generator=g)), float(torch.randint(0, 16, (), generator=g))
            t: dict[str, torch.Tensor] = {
                "boxes": torch.tensor([[x0, y0, x0 + 24.0, y0 + 20.0]]),
                "labels": torch.randint(1, 3, (1,), generator=g),
            }
            if masks:
                m = torch.zeros(1, h, w, dtype=torch.uint8)
                m[:, int(y0):int(y0) + 20, int(x0):int(x0) + 24] = 1
                t["masks"] = m
            if keypoints:
                t["keypoints"] = torch.tensor([[[x0 + 4, y0 + 4, 1.0], [x0 + 12, y0 + 10, 1.0], [x0 + 20, y0 + 16, 1.0]]])
            targets.append(t)
        return images, targets

    return batch


SMALL_RCNN = dict(
    weights=None, weights_backbone=None, num_classes=3, min_size=48, max_size=64,
    rpn_pre_nms_top_n_train=40, rpn_post_nms_top_n_train=20, rpn_batch_size_per_image=32,
    box_batch_size_per_image=16, box_detections_per_img=10,
)


def wav(n: int = 1600, b: int = 2) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    return lambda s: (torch.randn(b, n, generator=_gen(s)), torch.tensor([n, n - 200]))


def feats(t: int, f: int, b: int = 2) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    return lambda s: (torch.randn(b, t, f, generator=_gen(s)), torch.tensor([t, t - 3]))


def rnnt_batch(s: int) -> tuple[torch.Tensor, ...]:
    g = _gen(s)
    return (
        torch.randn(2, 16, 16, generator=g), torch.tensor([16, 12]),
        torch.randint(0, 20, (2, 5), generator=g), torch.tensor([5, 4]),
    )


Z: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    # classification
    "resnet18": (lambda: tv.resnet18(num_classes=3), img(32)),
    "resnext": (lambda: tv.resnext50_32x4d(num_classes=3), img(32)),
    "wide_resnet": (lambda: tv.wide_resnet50_2(num_classes=3), img(32)),
    "vgg11_bn": (lambda: tv.vgg11_bn(num_classes=3), img(32)),
    "alexnet": (lambda: tv.alexnet(num_classes=3), img(64)),
    "squeezenet": (lambda: tv.squeezenet1_1(num_classes=3), img(48)),
    "densenet": (lambda: tv.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=3), img(32)),
    "densenet_me": (lambda: tv.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=3,
                                        memory_efficient=True), img(32)),
    "googlenet": (lambda: tv.googlenet(num_classes=3, aux_logits=True, init_weights=True), img(64)),
    "inception_v3": (lambda: tv.inception_v3(num_classes=3, aux_logits=True, init_weights=True), img(299, b=2)),
    "mobilenet_v2": (lambda: tv.mobilenet_v2(num_classes=3), img(32)),
    "mobilenet_v3": (lambda: tv.mobilenet_v3_small(num_classes=3), img(32)),
    "mnasnet": (lambda: tv.mnasnet0_5(num_classes=3), img(32)),
    "shufflenet": (lambda: tv.shufflenet_v2_x0_5(num_classes=3), img(32)),
    "efficientnet": (lambda: tv.efficientnet_b0(num_classes=3), img(32)),
    "efficientnet_v2": (lambda: tv.efficientnet_v2_s(num_classes=3), img(32)),
    "regnet": (lambda: tv.regnet_y_400mf(num_classes=3), img(32)),
    "convnext": (lambda: tv.convnext.ConvNeXt([tv.convnext.CNBlockConfig(16, 32, 1), tv.convnext.CNBlockConfig(32, None, 2)],
                                             stochastic_depth_prob=0.1, num_classes=3), img(32)),
    "vit": (lambda: tv.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, dropout=0.1,
                                         num_classes=3), img(32)),
    "swin": (lambda: tv.swin_transformer.SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], stochastic_depth_prob=0.1,
                                                         num_classes=3), img(32)),
    "swin_v2": (lambda: tv.swin_transformer.SwinTransformer(
        [4, 4], 16, [2, 2], [2, 4], [4, 4], num_classes=3, block=tv.swin_transformer.SwinTransformerBlockV2,
        downsample_layer=tv.swin_transformer.PatchMergingV2), img(32)),
    "maxvit": (lambda: tv.maxvit.MaxVit((32, 32), 16, 2, [16, 32], [1, 1], 8, 0.1, num_classes=3), img(32)),
    # segmentation: dict outputs, an auxiliary head
    "fcn": (lambda: segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=3, aux_loss=True), img(32)),
    "deeplabv3": (lambda: segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3,
                                                                    aux_loss=True), img(32)),
    "lraspp": (lambda: segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3), img(32)),
    # detection: lists of images and target dicts in, a loss dict out
    "fasterrcnn": (lambda: detection.fasterrcnn_mobilenet_v3_large_fpn(**SMALL_RCNN), det_batch()),
    "fasterrcnn_r50": (lambda: detection.fasterrcnn_resnet50_fpn(**SMALL_RCNN), det_batch()),
    "maskrcnn": (lambda: detection.maskrcnn_resnet50_fpn(**SMALL_RCNN), det_batch(masks=True)),
    "keypointrcnn": (lambda: detection.keypointrcnn_resnet50_fpn(**SMALL_RCNN, num_keypoints=3), det_batch(keypoints=True)),
    "retinanet": (lambda: detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3, min_size=48,
                                                           max_size=64, topk_candidates=20), det_batch()),
    "fcos": (lambda: detection.fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3, min_size=48, max_size=64,
                                                 topk_candidates=20), det_batch()),
    "ssdlite": (lambda: detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3,
                                                                topk_candidates=20), det_batch()),
    # video
    "r3d_18": (lambda: video.r3d_18(num_classes=3), clip(32)),
    "r2plus1d": (lambda: video.r2plus1d_18(num_classes=3), clip(32)),
    "mvit_v2": (lambda: video.MViT((32, 32), 4, [
        video.mvit.MSBlockConfig(1, 16, 16, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 4, 4]),
        video.mvit.MSBlockConfig(1, 16, 32, [3, 3, 3], [3, 3, 3], [1, 2, 2], [1, 2, 2]),
        video.mvit.MSBlockConfig(2, 32, 32, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 2, 2]),
    ], residual_pool=True, residual_with_cls_embed=False, rel_pos_embed=True, proj_after_attn=True, dropout=0.1,
        stochastic_depth_prob=0.1, num_classes=3), clip(32)),
    "swin3d": (lambda: video.swin3d_t(num_classes=3), clip(32)),
    # optical flow: one update block called 12 times per forward
    "raft_small": (lambda: optical_flow.raft_small(weights=None),
                   lambda s: (torch.randn(1, 3, 128, 128, generator=_gen(s)), torch.randn(1, 3, 128, 128, generator=_gen(s + 1)), 6)),
    # audio
    "wav2vec2": (lambda: ta.wav2vec2_model(
        "group_norm", [(32, 10, 5), (32, 3, 2), (32, 2, 2)], False, 32, 0.1, 16, 2, 2, 2, 0.1, 64, 0.1, 0.1,
        False, 0.1, 5), wav()),
    "hubert": (lambda: ta.hubert_pretrain_model(
        "group_norm", [(32, 10, 5), (32, 3, 2), (32, 2, 2)], False, 32, 0.1, 16, 2, 2, 2, 0.1, 64, 0.1, 0.1,
        False, 0.0, 0.5, "static", 0.0, 2, False, 0, 0.0, "static", 0.0, 2, False, 0, False, False, 10, 16, 0.1),
        lambda s: (torch.randn(2, 1600, generator=_gen(s)), torch.randint(0, 10, (2, 79), generator=_gen(s)))),
    "wavlm": (lambda: ta.wavlm_model(
        "group_norm", [(32, 10, 5), (32, 3, 2), (32, 2, 2)], False, 32, 0.1, 16, 2, 2, 2, 8, 16, 0.1, 64, 0.1,
        0.1, False, 0.1, 5), lambda s: torch.randn(2, 1600, generator=_gen(s))),
    "conformer": (lambda: ta.Conformer(16, 2, 32, 2, 7, dropout=0.1), feats(12, 16)),
    "emformer": (lambda: ta.Emformer(16, 2, 32, 2, segment_length=4, right_context_length=1, dropout=0.1),
                 lambda s: (torch.randn(2, 13, 16, generator=_gen(s)), torch.tensor([13, 10]))),
    "emformer_rnnt": (lambda: ta.emformer_rnnt_model(
        input_dim=16, encoding_dim=32, num_symbols=20, segment_length=4, right_context_length=1,
        time_reduction_input_dim=16, time_reduction_stride=2, transformer_num_heads=2, transformer_ffn_dim=64,
        transformer_num_layers=2, transformer_dropout=0.1, transformer_activation="gelu",
        transformer_left_context_length=8, transformer_max_memory_size=0, transformer_weight_init_scale_strategy="depthwise",
        transformer_tanh_on_mem=True, symbol_embedding_dim=16, num_lstm_layers=1, lstm_layer_norm=True,
        lstm_layer_norm_epsilon=1e-5, lstm_dropout=0.1), rnnt_batch),
    "convtasnet": (lambda: ta.ConvTasNet(num_sources=2, enc_kernel_size=8, enc_num_feats=16, msk_kernel_size=3,
                                         msk_num_feats=16, msk_num_hidden_feats=32, msk_num_layers=2, msk_num_stacks=2),
                   lambda s: torch.randn(2, 1, 400, generator=_gen(s))),
    "deepspeech": (lambda: ta.DeepSpeech(16, n_hidden=32, n_class=5, dropout=0.1),
                   lambda s: torch.randn(2, 1, 10, 16, generator=_gen(s))),
    "wav2letter": (lambda: ta.Wav2Letter(num_classes=5, input_type="mfcc", num_features=13),
                   lambda s: torch.randn(2, 13, 64, generator=_gen(s))),
    "wavernn": (lambda: ta.WaveRNN([2, 2], 16, hop_length=4, n_res_block=2, n_rnn=16, n_fc=16, n_freq=8,
                                   n_hidden=8, n_output=8),
                lambda s: (torch.randn(2, 1, 24, generator=_gen(s)), torch.randn(2, 1, 8, 10, generator=_gen(s)))),
    "hdemucs": (lambda: ta.HDemucs(sources=["a", "b"], channels=8, depth=2, nfft=64),
                lambda s: torch.randn(1, 2, 1024, generator=_gen(s))),
}


#: Models made of torch's layers alone (Sequentials of convs, norms, activations), with no
#: block to replay (NOTE [One-op modules]): nothing to drop, so recompute and the tight
#: budgets are left out; keep, offload and auto run.
NO_BLOCKS = frozenset({"vgg11_bn", "alexnet", "wav2letter"})


def main() -> int:
    return run(
        {name: (lambda f=f: Loss(f())) for name, (f, _) in Z.items()},
        lambda name, model: Z[name][1],
        skip=lambda name, variant: name in NO_BLOCKS and variant in ("recompute", "auto_tight", "auto_serve"),
    )


if __name__ == "__main__":
    raise SystemExit(main())
