"""A key/value cache handed to every layer in training: what it costs a replay.

Hugging Face decoders build a ``DynamicCache`` in training unless told ``use_cache=False``
and hand it to every layer. A replay must see the state the layer's forward saw, so each
layer call records the bindings the cache holds at its entry and exit (NOTE [Stateful
arguments] in offrecomp/arg_state.py): O(layers) per call. This benchmark trains a tiny
Llama (transformers' ``LlamaForCausalLM``) on the CPU under full recompute, with the
cache and without it, interleaved (one step of each per round, medians over rounds), and
prints the step times and what the cache adds per step and per layer call (one model, one
runtime, ``config.use_cache`` switched from step to step).

    python benchmarks/bench_cache_args.py [--layers 48] [--rounds 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
from benchmarks._args import out_file


def _model(layers: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4,
    )
    return LlamaForCausalLM(cfg).train()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10, help="steps of each before timing (measuring passes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=out_file(), default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    for name in ("layers", "seq", "rounds", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be at least 0, got {args.warmup}")
    try:
        import transformers
    except ImportError:
        print("bench_cache_args: needs transformers (pip install -e '.[transformers]')", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    x = torch.randint(0, 256, (2, args.seq), generator=torch.Generator().manual_seed(0))
    model = _model(args.layers)
    names = {False: "no cache", True: "cache"}
    times: dict[str, list[float]] = {name: [] for name in names.values()}
    with offrecomp.runtime(model, mode="recompute"):  # one runtime, the cache switched per step
        for r in range(args.warmup + args.rounds):
            for use_cache in (False, True) if r % 2 == 0 else (True, False):
                model.config.use_cache = use_cache
                start = time.perf_counter()
                model(input_ids=x, labels=x).loss.backward()
                model.zero_grad(set_to_none=True)
                if r >= args.warmup:
                    times[names[use_cache]].append(time.perf_counter() - start)
            if r >= args.warmup:
                print(f"round {r - args.warmup + 1}/{args.rounds}", file=sys.stderr)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    extra = med["cache"] - med["no cache"]
    print(
        f"tiny Llama, {args.layers} layers, {args.seq} tokens, full recompute, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {args.threads} thread(s), medians of {args.rounds} rounds"
    )
    for name, m in med.items():
        print(f"  {name:9s} {m * 1e3:8.1f} ms per step")
    print(f"  the cache adds {extra * 1e3:.1f} ms per step, {extra * 1e6 / args.layers:.0f} us per layer call "
          f"({med['cache'] / med['no cache']:.3f}x)")
    if args.out is not None:
        Path(args.out).write_text(json.dumps({"layers": args.layers, "ms_per_step": {k: v * 1e3 for k, v in med.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
