"""Case 5: does the runtime add graphs, graph breaks or recompiles, and does every step run
the compiled graphs?  For each compile setup (regional wrapped, regional in place, compiled
attention function, whole model, whole model in place) and each variant (plain, keep,
recompute, offload, auto, auto_serve), trains 5 steps of the common.py LM (dropout 0.1)
with a counting backend (aot_eager or inductor inside) and prints per step how many compiled
graph calls ran (forward graphs; replays add calls), the graphs made, dynamo's graph-break
counter and guard failures, and torch._dynamo.explain's graph/break count on one forward of
the model inside the runtime (explain runs under the runtime's hooks).  Bitwise comparison
with plain is included.  FLAG: graphs/breaks/recompiles differ from plain, or a step ran
fewer compiled calls than plain's same step.

Run: cd /tmp/sweep_compile && OMP_NUM_THREADS=1 TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_compile/inductor_cache \
     timeout 900 /work/main/.venv/bin/python sweep_c5.py [aot_eager|inductor] > out_c5_<backend>.txt 2>&1
"""
import copy
import contextlib
import sys
import warnings

warnings.filterwarnings("ignore")
from common import Counting, base_model, batch, lm_loss, manual_attn, torch, variant_runtime, assert_bitwise

INNER = sys.argv[1] if len(sys.argv) > 1 else "aot_eager"
STEPS = 5


def setups():
    def wrap(m, be):
        for i, b in enumerate(m.blocks):
            m.blocks[i] = torch.compile(b, backend=be)
        return m

    def inplace(m, be):
        for b in m.blocks:
            b.compile(backend=be)
        return m

    def attnfn(m, be):
        c = torch.compile(manual_attn, backend=be)
        for b in m.blocks:
            b.attn.attn_fn = c
        return m

    def whole(m, be):
        return torch.compile(m, backend=be)

    def whole_inpl(m, be):
        m.compile(backend=be)
        return m

    return {"wrap": wrap, "inplace": inplace, "attnfn": attnfn, "whole": whole, "whole_inpl": whole_inpl}


def run(setup, variant, budget=None):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.guard_failures.clear()
    be = Counting(INNER)
    m = copy.deepcopy(BASE).train()
    call = setup(m, be)
    rt = variant_runtime(call, variant, budget) if variant else None
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    per_step, snaps = [], []
    with rt if rt is not None else contextlib.nullcontext():
        for s in range(STEPS):
            r0 = be.runs
            torch.manual_seed(s)
            idx = batch(s)
            loss = lm_loss(call(idx), idx)
            loss.backward()
            per_step.append(be.runs - r0)
            snaps.append({**{n: p.grad.clone() for n, p in m.named_parameters()}, "loss": loss.detach()})
            opt.step()
            opt.zero_grad()
        c = torch._dynamo.utils.counters
        counts = dict(made=be.made, breaks=sum(c["graph_break"].values()),
                      recompiles=sum(len(v) for v in torch._dynamo.utils.guard_failures.values()))
        # explain one more forward inside the runtime (after the counts: explain traces anew)
        try:
            ex = torch._dynamo.explain(call)(batch(99))
            expl = f"explain graphs={ex.graph_count} breaks={ex.graph_break_count}"
        except Exception as e:  # noqa: BLE001
            expl = f"explain ERROR {type(e).__name__}"
    return per_step, counts, expl, snaps, rt


BASE = base_model()
flags = 0
for name, setup in setups().items():
    ref_steps, ref_counts, ref_expl, ref, _ = run(setup, None)
    print(f"== {name} ({INNER}) plain: runs/step {ref_steps} {ref_counts} {ref_expl}", flush=True)
    for v in ("keep", "recompute", "offload", "auto", "auto_serve"):
        budget = None
        if v == "auto_serve":
            _, _, _, _, krt = run(setup, "keep")
            budget = krt.report().steps[0].peak_activation_bytes // 2
        try:
            st, counts, expl, got, rt = run(setup, v, budget)
            assert_bitwise(ref, got)
            notes = []
            if counts != ref_counts:
                notes.append("counts differ")
            if any(a < b for a, b in zip(st, ref_steps)):
                notes.append("a step ran fewer compiled calls")
            if expl != ref_expl:
                notes.append("explain differs")
            flags += bool(notes)
            phases = [s.phase[:4] for s in rt.report().steps]
            print(f"{'FLAG' if notes else 'PASS'} {name:10s} {v:10s} runs/step {st} {counts} {expl} phases {phases} {'; '.join(notes)}", flush=True)
        except Exception as e:  # noqa: BLE001
            flags += 1
            print(f"FAIL {name:10s} {v:10s} {type(e).__name__}: {str(e)[:300]}", flush=True)
sys.exit(1 if flags else 0)
