"""(a) custom autograd.Function keeping a big intermediate on ctx (not save_for_backward).

usage: ctx_state.py MODE [--profile] [--steps N] [--mib M]
MODE: plain | keep | recompute | auto
"""
import argparse
import json
import sys
import time

from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ctx_common as common  # noqa: E402  (installs the counters)
import torch  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp  # noqa: E402


BUFX = 1


class CtxBuf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        # big intermediate kept on ctx, NOT save_for_backward (BUFX times the activation)
        ctx.buf = (x * 2).repeat(1, BUFX) if BUFX > 1 else x * 2
        return x * x

    @staticmethod
    def backward(ctx, g):
        return g * ctx.buf[:, : g.shape[1]]


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x):
        h = self.a(x)
        h = CtxBuf.apply(h)
        return x + self.b(torch.tanh(h))


class Model(nn.Module):
    def __init__(self, d, n=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--mib", type=float, default=8.0)  # size of the activation / ctx.buf
    ap.add_argument("--bufx", type=int, default=1)
    args = ap.parse_args()
    global BUFX
    BUFX = args.bufx
    d = 512
    rows = int(args.mib * (1 << 20) / 4 / d)
    torch.manual_seed(0)
    model = Model(d)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(rows, d, generator=g) for _ in range(args.steps)]

    def step(x):
        loss = model(x)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return grads

    out = {"mode": args.mode, "act_mib": rows * d * 4 / 2**20, "steps": []}
    rt = None
    if args.mode != "plain":
        rt = offrecomp.runtime(model, mode=args.mode)
        rt.__enter__()
    all_grads = []
    try:
        for i, x in enumerate(xs):
            before = dict((k, v) for k, v in common.COUNT.items() if not isinstance(v, list))
            t0 = time.perf_counter()
            if args.profile:
                fpk, fnet, loss = common.peak_of(lambda: model(x))
                common.WINDOWS.clear()
                bpk, bnet, _ = common.peak_of(lambda: loss.backward())
                rp = common.peak_in_windows(common.LAST_EVENTS, common.WINDOWS)
                del loss
                grads = [p.grad.clone() for p in model.parameters()]
                model.zero_grad(set_to_none=True)
                peak = max(fpk, fnet + bpk)
                extra = {"fwd_peak_MiB": round(fpk / 2**20, 2), "fwd_end_MiB": round(fnet / 2**20, 2),
                         "bwd_peak_above_bwd_start_MiB": round(bpk / 2**20, 2),
                         "peak_inside_replays_above_bwd_start_MiB": None if rp is None else round(rp / 2**20, 2)}
            else:
                peak, net, grads = None, None, step(x)
                extra = {}
            dt = time.perf_counter() - t0
            all_grads.append(grads)
            after = dict((k, v) for k, v in common.COUNT.items() if not isinstance(v, list))
            delta = {k: after[k] - before[k] for k in after}
            out["steps"].append({"step": i, "wall_s": round(dt, 4),
                                 "real_peak_MiB": None if peak is None else round(peak / 2**20, 2), **extra,
                                 **{k: (round(v, 5) if isinstance(v, float) else v) for k, v in delta.items()}})
    finally:
        if rt is not None:
            rt.__exit__(None, None, None)
    if rt is not None:
        rep = rt.report()
        out["report_steps"] = [
            {"step": s.step, "phase": s.phase, "peak_act_MiB": round(s.peak_activation_bytes / 2**20, 2),
             "recomputed_MiB": round(s.recomputed_bytes / 2**20, 2), "replays": s.replays,
             "recompute_s": round(s.recompute_seconds, 4), "step_s": round(s.step_seconds, 4)}
            for s in rep.steps
        ]
    out["made_state"] = common.COUNT["made_state"]
    import tempfile  # the gradients, to compare modes bitwise across runs

    torch.save(all_grads, Path(tempfile.gettempdir()) / f"ctx_state_grads_{args.mode}_{args.mib}_{args.bufx}.pt")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
