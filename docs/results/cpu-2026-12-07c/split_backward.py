"""(d) auto mode under a pipeline-like schedule: what the measuring pass's profile holds.

usage: split_backward.py SCHED [--steps 8] [--mb 4] [--no-opt]
SCHED: seq   : F0 B0 F1 B1 ...              (gradient accumulation, the reference)
       allf  : F0 F1 .. Fn-1 B0 B1 .. Bn-1    (all forwards, then all backwards)
       1f1b  : warmup 2: F0 F1 B0 F2 B1 F3 B2 B3 (for mb=4)
"""
import argparse
import logging
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(levelname)s %(message)s")
import json
import sys
import time

import torch  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp  # noqa: E402
import offrecomp.planning.planner as P  # noqa: E402
import offrecomp.planning.profiling as PR  # noqa: E402

LOG = []

_orig_end = P.Planner._end_pass


def _end_pass(self, p):
    if p.recording:
        calls = [c for c in p.calls]
        LOG.append({
            "event": "measuring pass end", "pass": p.index if hasattr(p, "index") else None,
            "stage": str(p.stage), "calls": len(calls),
            "replay_marks_at_end": len(p.replay_marks),
            "replayed_calls_at_end": sorted({o for o, _, _ in p.replay_marks}),
            "call_ordinals": [c.ordinal for c in calls],
            "backward_ends": len(p.backward_ends),
            "t": time.perf_counter(),
        })
        MEASURING.append(p)
    return _orig_end(self, p)


P.Planner._end_pass = _end_pass
MEASURING = []
PROFILES = []
_orig_build = PR.build_profile
_orig_bwd = PR._backward_seconds
NONE_BWD = []


def _bwd(clock, ordinal, marks, timeline):
    r = _orig_bwd(clock, ordinal, marks, timeline)
    if r is None:
        NONE_BWD.append(ordinal)
    return r


PR._backward_seconds = _bwd


def _build(p, replay_marks, end_mark, **kw):
    NONE_BWD.clear()
    prof, st = _orig_build(p, replay_marks, end_mark, **kw)
    clock = kw["clock"]
    PROFILES.append({
        "signature": str(p.signature)[:60],
        "replay_marks_used": len(replay_marks),
        "replay_marks_on_pass_now": len(p.replay_marks),
        "replay_seconds_used": round(sum(clock.seconds(a, b) or 0.0 for _, a, b in replay_marks), 4),
        "replay_seconds_on_pass_now": round(sum(clock.seconds(a, b) or 0.0 for _, a, b in p.replay_marks), 4),
        "profile_forward_s": round(prof.forward_seconds, 4),
        "profile_backward_s": round(prof.backward_seconds, 4),
        "regions": [(r.name, r.call_index, round(r.forward_seconds, 4), round(r.backward_seconds, 4)) for r in prof.regions],
        "ordinals_with_no_replay_mark(backward=2x fwd estimate)": list(NONE_BWD),
        "t": time.perf_counter(),
    })
    return prof, st


PR.build_profile = _build
P.profiling.build_profile = _build


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, 4 * d)
        self.b = nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(self.ln(x))))


class Model(nn.Module):
    def __init__(self, d=256, n=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def schedule(kind, n):
    if kind == "seq":
        return [op for i in range(n) for op in (("F", i), ("B", i))]
    if kind == "allf":
        return [("F", i) for i in range(n)] + [("B", i) for i in range(n)]
    if kind == "1f1b":
        warm = 2
        ops = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < n:
            ops.append(("B", b)); b += 1
            if f < n:
                ops.append(("F", f)); f += 1
        return ops
    raise SystemExit(kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sched")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--mb", type=int, default=4)
    ap.add_argument("--no-opt", action="store_true")
    ap.add_argument("--budget", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    sched = schedule(args.sched, args.mb)
    print("schedule:", " ".join(f"{k}{i}" for k, i in sched), file=sys.stderr)
    with offrecomp.runtime(model, mode="auto", budget=args.budget) as rt:
        for step in range(args.steps):
            xs = [torch.randn(8, 128, 256, generator=g) for _ in range(args.mb)]
            losses = {}
            for k, i in sched:
                if k == "F":
                    losses[i] = model(xs[i]) / args.mb
                else:
                    losses.pop(i).backward()
            if not args.no_opt:
                opt.step()
                opt.zero_grad(set_to_none=True)
        rep = rt.report()
        expl = rt.explain()
        entries = rt.planner.entries
    out = {"sched": args.sched, "log": LOG, "profiles": PROFILES}
    out["report"] = [
        {"step": s.step, "passes": s.passes, "phases": s.phases, "replays": s.replays,
         "recompute_s": round(s.recompute_seconds, 4), "step_s": round(s.step_seconds, 4),
         "recomputed_MiB": round(s.recomputed_bytes / 2**20, 1), "kept_MiB": round(s.kept_bytes / 2**20, 1),
         "peak_MiB": round(s.peak_activation_bytes / 2**20, 1),
         "fwd_s": round(s.forward_seconds, 4),
         "pred_step_s": None if s.predicted_step_seconds is None else round(s.predicted_step_seconds, 4),
         "pred_recompute_s": None if s.predicted_recompute_seconds is None else round(s.predicted_recompute_seconds, 4),
         "pred_fwd_s": None if s.predicted_forward_seconds is None else round(s.predicted_forward_seconds, 4),
         "pred_peak_MiB": None if s.predicted_peak_bytes is None else round(s.predicted_peak_bytes / 2**20, 1)}
        for s in rep.steps
    ]
    # replays each measuring pass's calls eventually ran, vs what its profile saw
    out["measuring_passes_final"] = [
        {"calls": len(p.calls), "replay_marks_final": len(p.replay_marks),
         "replays_per_call_final": [c.replays for c in p.calls]}
        for p in MEASURING
    ]
    ents = {}
    for sig, e in entries.items():
        pr = e.profile
        ents[str(sig)[:60]] = None if pr is None else {
            "forward_s": round(pr.forward_seconds, 4), "backward_s": round(pr.backward_seconds, 4),
            "regions": [(r.name, r.call_index, round(r.forward_seconds, 4), round(r.backward_seconds, 4)) for r in pr.regions],
        }
    out["entries"] = ents
    print(json.dumps(out, indent=1, default=str))
    print(expl, file=sys.stderr)


if __name__ == "__main__":
    main()
