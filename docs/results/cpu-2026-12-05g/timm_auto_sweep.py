"""timm architectures found automatically from ``timm.list_models()`` (those not in
../cpu-2026-12-05/timm_sweep.py) under every zoo variant, gradients, buffers and losses
compared bitwise with plain training (tests/helpers.check_variant).

    cd /work/main && OMP_NUM_THREADS=1 PYTHONPATH=/tmp/sweep5c/pkgs .venv/bin/python docs/results/cpu-2026-12-05g/timm_auto_sweep.py [NAME,...|all] [VARIANT,...] [-v] [--rescreen]

timm 1.0.31, torch 2.13.0+cpu, Python 3.11, 4 SGD steps each on the CPU. /tmp/sweep5c/pkgs
holds timm and torchvision 0.28.0 set up as ../cpu-2026-12-05b/tv_stubs.py says (imported
here before timm).

Families: timm's models grouped by (defining module, name stem: the leading letters of
the name, ``tf_`` dropped, a ``vN`` suffix kept, ``test_*`` and ``inception_*`` by their
first two words); the families of timm_sweep.py's models are left out. Of each family the
variant with the fewest parameters (counted on the meta device) is built with
``pretrained=False, num_classes=5`` and trained on 2 images of the smallest side of
32, 64, 128, 224 it takes (``img_size=`` passed where the model accepts it), with a
cross-entropy loss on seeded random labels (summed over a tuple of heads). A screen
trains each plainly twice and leaves out those that fail, differ bitwise between the
two runs, have a non-finite loss, or take over 0.7 s for 4 plain steps (a variant then
takes over ~2 s); the screen is cached in /tmp/sweep5g/screen.json (``--rescreen``
redoes it; ``--screen=K/N`` screens the K-th of N shares into screen.K-of-N.json beside it,
which a later run merges) and its reasons written to skipped.txt. Models with no repeated blocks
(offrecomp finds no region) run keep, offload and auto only. Prints PASS/FAIL per model
and variant.
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import math
import re
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))

import tv_stubs  # noqa: F401  (before torchvision, which timm imports)

# isort: split
import timm
import timm.models._registry as registry
import torch
from sweep import run
from torch import nn

from offrecomp.regions import discover_regions
from tests.helpers import _bits, train

warnings.filterwarnings("ignore")
logging.getLogger("timm").setLevel(logging.ERROR)
HERE = Path(__file__).resolve().parent
CACHE = Path("/tmp/sweep5g/screen.json")
SIZES = (32, 64, 128, 224)
MAX_PLAIN_S = 0.7
MAX_PARAMS = 40_000_000
NO_REGION_SKIP = ("recompute", "auto_tight", "auto_serve")

# the models of ../cpu-2026-12-05/timm_sweep.py's Z (their families are left out)
SWEPT = [
    "vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "swin_tiny_patch4_window7_224",
    "convnext_atto", "resnet18", "resnet26d", "efficientnet_b0", "mobilenetv3_small_050",
    "regnety_002", "densenet121", "cait_xxs24_224", "poolformer_s12", "maxvit_rmlp_pico_rw_256",
    "coatnet_nano_rw_224", "levit_128s", "eva02_tiny_patch14_224", "ghostnet_100", "nfnet_l0",
    "xcit_nano_12_p8_224", "pit_ti_224", "dla34", "res2net50_14w_8s", "beit_base_patch16_224",
    "hiera_tiny_224", "mambaout_femto", "fastvit_t8", "mixer_b16_224", "convmixer_768_32",
    "resnest14d", "sequencer2d_s", "pvt_v2_b0", "mobilevit_xxs", "edgenext_xx_small",
    "cspresnet50", "hgnetv2_b0", "repvgg_a0", "rexnet_100", "ese_vovnet19b_slim",
    "twins_pcpvt_small", "gcvit_xxtiny", "nest_tiny", "tresnet_m", "selecsls42b",
    "inception_next_atto", "volo_d1_224", "regnetz_b16", "resnet26t",
]


def family(name: str) -> str:
    """A model's family: its module and name stem."""
    module = registry._model_to_module[name]
    n = name.removeprefix("tf_")
    if n.startswith(("test_", "inception_")):
        stem = "_".join(n.split("_")[:2])
    else:
        stem = re.match(r"[a-z]+(?:v\d+)?", n).group(0)  # type: ignore[union-attr]
    return f"{module}.{stem}"


def n_params(name: str) -> int:
    with torch.device("meta"):
        m = timm.create_model(name, pretrained=False, num_classes=5)
    return sum(p.numel() for p in m.parameters())


class Cls(nn.Module):
    """A timm model and a cross-entropy loss on its logits (summed over a tuple of heads)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = xy
        o = self.m(x)
        outs = o if isinstance(o, (tuple, list)) else (o,)
        return sum(nn.functional.cross_entropy(t.float(), y) for t in outs)


def batch_of(size: int) -> Any:
    def batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + s)
        return torch.randn(2, 3, size, size, generator=g), torch.randint(0, 5, (2,), generator=g)

    return batch


def build(name: str, size: int, img_kw: bool) -> Cls:
    kw: dict[str, Any] = {"img_size": size} if img_kw else {}
    return Cls(timm.create_model(name, pretrained=False, num_classes=5, **kw))


def fit(name: str) -> tuple[int, bool]:
    """The smallest input side ``name`` trains on, and whether it takes ``img_size=``."""
    errors = []
    for size in SIZES:
        for img_kw in (True, False):
            try:
                torch.manual_seed(0)
                model = build(name, size, img_kw).train()
                model(batch_of(size)(0)).backward()
                return size, img_kw
            except Exception as e:
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}")
    raise RuntimeError(f"no input side of {SIZES} trains; last: {errors[-1]}")


class _TooLarge(Exception):
    pass


class _Timeout(BaseException):  # past the screen's own `except Exception`
    pass


def _alarm(*_: Any) -> None:
    raise _Timeout("over 30 s")


def screen(shard: int = 0, of: int = 1) -> dict[str, dict[str, Any]]:
    """family -> its representative, input side, ``img_size=`` use, regions, and why it is
    skipped ('' where it trains plainly, deterministically and fast)."""
    swept = {family(n) for n in SWEPT}
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for n in timm.list_models():
        groups[family(n)].append(n)
    signal.signal(signal.SIGALRM, _alarm)
    out: dict[str, dict[str, Any]] = {}
    for i, (fam, names) in enumerate(sorted(groups.items())):
        if fam in swept or i % of != shard:
            continue
        rec: dict[str, Any] = {"model": names[0], "why": ""}
        signal.alarm(30)
        try:
            counts = {}
            for n in names:
                try:
                    counts[n] = n_params(n)
                except Exception:
                    continue
            if not counts:
                raise RuntimeError("no variant builds on the meta device")
            name = min(counts, key=lambda n: (counts[n], n))
            rec.update(model=name, params=counts[name])
            if counts[name] > MAX_PARAMS:
                raise _TooLarge(f"too large: smallest variant has {counts[name] / 1e6:.0f}M parameters")
            size, img_kw = fit(name)
            rec.update(size=size, img_kw=img_kw)
            torch.manual_seed(0)
            model = build(name, size, img_kw).train()
            rec["regions"] = len(discover_regions(model, None))
            b = batch_of(size)
            t0 = time.time()
            a = train(copy.deepcopy(model), b, steps=4)
            dt = time.time() - t0
            c = train(copy.deepcopy(model), b, steps=4)
            rec["plain_s"] = round(dt, 3)
            if not all(math.isfinite(s["loss"].item()) for s in a):
                rec["why"] = "non-finite loss plainly"
            elif not all(torch.equal(_bits(x[k]), _bits(y[k])) for x, y in zip(a, c) for k in x):
                rec["why"] = "nondeterministic plainly (two plain runs differ bitwise)"
            elif dt > MAX_PLAIN_S:
                rec["why"] = f"slow: 4 plain steps take {dt:.1f} s"
        except BaseException as e:  # any failure of a representative is a skip
            if isinstance(e, KeyboardInterrupt):
                raise
            rec["why"] = str(e) if isinstance(e, _TooLarge) else f"fails plainly: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            signal.alarm(0)
        out[fam] = rec
        print(f"screen {fam:44s} {rec['model']:40s} {rec.get('size', '-')!s:4s} {rec['why'] or 'ok'}",
              file=sys.stderr, flush=True)
    return out


def main() -> int:
    shard = next((a.split("=")[1] for a in sys.argv if a.startswith("--screen=")), None)
    if shard is not None:  # one share of the screen, for a parallel run: --screen=K/N
        k, n = map(int, shard.split("/"))
        part = CACHE.with_name(f"screen.{k}-of-{n}.json")
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text(json.dumps(screen(k, n), indent=1))
        return 0
    if "--rescreen" in sys.argv or not CACHE.exists() or json.loads(CACHE.read_text()).get("version") != timm.__version__:
        parts = sorted(CACHE.parent.glob("screen.*-of-*.json"))
        if parts and "--rescreen" not in sys.argv:
            result = {f: r for p in parts for f, r in json.loads(p.read_text()).items()}
        else:
            result = screen()
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps({"version": timm.__version__, "result": result}, indent=1))
        lines = [f"{f:44s} {r['model']:40s} {r['why']}" for f, r in sorted(result.items()) if r["why"]]
        (HERE / "skipped.txt").write_text(
            f"# timm {timm.__version__}: {len(lines)} of {len(result)} candidate families skipped\n"
            + "\n".join(lines) + "\n"
        )
    result = json.loads(CACHE.read_text())["result"]
    sys.argv = [a for a in sys.argv if a != "--rescreen"]
    ok = {r["model"]: r for r in result.values() if not r["why"]}
    models = {n: (lambda r=r: build(r["model"], r["size"], r["img_kw"])) for n, r in ok.items()}

    def batch(name: str, model: nn.Module) -> Any:
        return batch_of(ok[name]["size"])

    def skip(name: str, variant: str) -> bool:
        return ok[name]["regions"] == 0 and variant in NO_REGION_SKIP

    return run(models, batch, skip)


if __name__ == "__main__":
    raise SystemExit(main())
