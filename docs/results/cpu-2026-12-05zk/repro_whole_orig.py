"""Repro: the loop calls cm = torch.compile(model) while the runtime was given `model` (the
uncompiled module the compiled wrapper holds). Dynamo then traces offrecomp's own wrappers
and bookkeeping (holds_compiled(model) is False, so nothing is excluded from dynamo):
keep/recompute/offload make 6 graphs instead of 1, with 28 graph breaks and 9 recompiles
in 4 steps; auto makes ~44 graphs, and traces into the planner (scheduler/flat.py numpy
code); with backend="inductor" auto then raises InductorError (LoweringException:
DynamicOutputShapeException aten.repeat_interleave.Tensor) at the planning step.
Gradients where no error are bitwise equal to plain.
Docs: "no added graph or graph break" (reliability.md); README: blocks inside
torch.compile(model) are kept or offloaded with a warning.

Run: cd /tmp/sweep_compile && OMP_NUM_THREADS=1 TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_compile/inductor_cache \
     /work/main/.venv/bin/python repro_whole_orig.py
Exits 1 while the defect exists."""
import copy
import os
import sys
import warnings

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/sweep_compile/inductor_cache")
sys.path.insert(0, "/work/main")
import torch
import offrecomp
from tests import models

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
torch.manual_seed(0)
base = models.GPT(layers=2, h=32, heads=4, p=0.0)


def batch(s):
    return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))


def run(mode, backend, rt_on_original):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.guard_failures.clear()
    m = copy.deepcopy(base)
    cm = torch.compile(m, backend=backend)
    rt = offrecomp.runtime(m if rt_on_original else cm, mode=mode, min_bytes=0) if mode else None
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    grads = []
    try:
        with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
            for s in range(4):
                cm(batch(s)).backward()
                grads.append([p.grad.clone() for p in m.parameters()])
                opt.step()
                opt.zero_grad()
    except Exception as e:  # noqa: BLE001
        return f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:120]}", None
    c = torch._dynamo.utils.counters
    rec = sum(len(v) for v in torch._dynamo.utils.guard_failures.values())
    return f"graphs={c['stats']['unique_graphs']} breaks={sum(c['graph_break'].values())} recompiles={rec}", grads


bad = False
for backend, modes in (("aot_eager", ("keep", "recompute", "auto")), ("inductor", ("keep", "auto"))):
    plain, ref = run(None, backend, False)
    print(f"{backend:9s} plain                      : {plain}", flush=True)
    for mode in modes:
        for orig in (False, True):
            got, grads = run(mode, backend, orig)
            same = grads is not None and all(torch.equal(a, b) for x, y in zip(ref, grads) for a, b in zip(x, y))
            print(f"{backend:9s} {mode:9s} rt on {'original' if orig else 'compiled'}: {got} bitwise={same}", flush=True)
            if got != plain or not same:
                bad = True
print("DEFECT: runtime given the original module of torch.compile(model) is traced by dynamo" if bad else "ok")
sys.exit(1 if bad else 0)
