"""Repro: torch.compile(model, fullgraph=True) (or model.compile(fullgraph=True)) under
offrecomp.runtime raises torch._dynamo.exc.Unsupported ("Skip inlining
torch.compiler.disable()d function") in every mode (keep included); without fullgraph the
same setup gets one extra graph break (counters['graph_break']) that plain does not have.
Docs: "no added graph or graph break" (reliability.md), "a model compiles as without the
runtime" (design.md, NOTE [Compiled regions]).

Run: cd /tmp/sweep_compile && OMP_NUM_THREADS=1 /work/main/.venv/bin/python repro_whole_fullgraph.py
Exits 1 while the defect exists."""
import copy
import sys

sys.path.insert(0, "/work/main")
import torch
import offrecomp
from tests import models

torch.set_num_threads(1)
torch.manual_seed(0)
base = models.GPT(layers=2, h=32, heads=4, p=0.0)
idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
bad = False


def step(how, mode, fullgraph):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m = copy.deepcopy(base)
    if how == "torch.compile(model)":
        call = torch.compile(m, backend="aot_eager", fullgraph=fullgraph)
    else:
        m.compile(backend="aot_eager", fullgraph=fullgraph)
        call = m
    rt = offrecomp.runtime(call, mode=mode, min_bytes=0) if mode else None
    try:
        with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
            call(idx).backward()
    except Exception as e:  # noqa: BLE001
        return f"ERROR {type(e).__name__}: {str(e).splitlines()[0]}"
    br = dict(torch._dynamo.utils.counters["graph_break"])
    return f"ok, graph breaks {sum(br.values())} {list(br)[:1]}"


for how in ("torch.compile(model)", "model.compile()"):
    for fullgraph in (False, True):
        plain = step(how, None, fullgraph)
        print(f"{how:22s} fullgraph={fullgraph!s:5s} plain: {plain}")
        for mode in ("keep", "recompute"):
            got = step(how, mode, fullgraph)
            print(f"{how:22s} fullgraph={fullgraph!s:5s} {mode:9s}: {got}")
            if got != plain:
                bad = True
print("DEFECT: the runtime changes what dynamo does with a whole-model compile" if bad else "ok")
sys.exit(1 if bad else 0)
