"""torchvision 0.28 and torchaudio 2.11 beside torch 2.13.0+cpu, for the sweeps of this folder.

Their PyPI wheels link CUDA builds of torch's libraries, which a CPU torch lacks, so their
C++ libraries cannot load. Their models are Python; what they need of those libraries is
given here in Python, slower and enough for tiny inputs:

* torchvision: ``nms`` (a greedy loop) and ``roi_align`` (torchvision's own eager
  ``_roi_align``, with a backward through autograd), the schemas of its other ops, and
  empty stand-ins for its meta and autograd registration modules;
* torchaudio: nothing (its models are Python; with no library it skips its C++ filters).

Setup, once (DIR as in the sweeps' command lines)::

    pip download --no-deps -d WHL torchvision==0.28.0 torchaudio==2.11.1
    pip install --no-deps --target DIR WHL/*.whl
    rm DIR/torchaudio/lib/*.so DIR/torchvision/_C.so DIR/torchvision/image.so
    sed -i '/^def _has_ops():/{n;s/return False/return True/}' DIR/torchvision/extension.py

Import this module before torchvision.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

_LIB = torch.library.Library("torchvision", "DEF")
for _schema in [
    "_cuda_version() -> int",
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
]:
    _LIB.define(_schema)


def _nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    keep = []
    for i in scores.argsort(descending=True).tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (area[i] + area - inter) > threshold
    return torch.tensor(keep, dtype=torch.long)


def _eager_roi_align(*args: Any) -> torch.Tensor:
    from torchvision.ops.roi_align import _roi_align  # wrapped in a lazy torch.compile

    return getattr(_roi_align, "__wrapped__", _roi_align)(*args)


class _RoIAlign(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, rois: torch.Tensor, *rest: Any) -> torch.Tensor:
        ctx.save_for_backward(input, rois)
        ctx.rest = rest
        with torch.no_grad():
            return _eager_roi_align(input, rois, *rest)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, rois = ctx.saved_tensors
        with torch.enable_grad():
            x = input.detach().requires_grad_()
            (gi,) = torch.autograd.grad(_eager_roi_align(x, rois, *ctx.rest), x, grad)
        return (gi,) + (None,) * (1 + len(ctx.rest))


_LIB.impl("_cuda_version", lambda: -1, "CompositeExplicitAutograd")
_LIB.impl("nms", _nms, "CPU")
_LIB.impl("roi_align", _eager_roi_align, "CPU")
_LIB.impl("roi_align", lambda *a: _RoIAlign.apply(*a), "Autograd")

for _name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules[_name] = types.ModuleType(_name)
