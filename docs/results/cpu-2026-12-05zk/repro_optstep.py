"""Repro: `step = torch.compile(opt.step)` (the PyTorch recipe for a compiled optimizer)
inside `with offrecomp.runtime(model, mode=...)`, model eager: dynamo traces the runtime's
global optimizer-step post hook (offrecomp/lifecycle.py on_optimizer_step, registered with
torch.optim.optimizer.register_optimizer_step_post_hook), breaks the graph inside it
(_torch_compat.current_graph_task_id) and converts ~27 extra frames of offrecomp code.
Gradients/params stay bitwise equal to plain. Docs: "no added graph or graph break".

Run: cd /tmp/sweep_compile && OMP_NUM_THREADS=1 /work/main/.venv/bin/python repro_optstep.py
Exits 1 while the defect exists."""
import copy
import sys
import warnings

sys.path.insert(0, "/work/main")
warnings.filterwarnings("ignore")
import torch
import offrecomp
from tests import models

torch.set_num_threads(1)
torch.manual_seed(0)
base = models.GPT(layers=2, h=32, heads=4, p=0.0)


def run(mode):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m = copy.deepcopy(base)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    step = torch.compile(opt.step, backend="aot_eager")
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode else None
    ps = []
    with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
        for s in range(3):
            m(torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))).backward()
            step()
            opt.zero_grad()
            ps.append([p.detach().clone() for p in m.parameters()])
    c = torch._dynamo.utils.counters
    br = [k.splitlines()[0] for k in c["graph_break"]]
    return (c["stats"]["unique_graphs"], sum(c["graph_break"].values()), c["frames"]["ok"]), br, ps


plain, pbr, ref = run(None)
print(f"plain : graphs, breaks, frames converted = {plain} {pbr}")
bad = False
for mode in ("keep", "recompute", "auto"):
    got, br, ps = run(mode)
    same = all(torch.equal(a, b) for x, y in zip(ref, ps) for a, b in zip(x, y))
    print(f"{mode:9s}: graphs, breaks, frames converted = {got} {br} bitwise={same}")
    bad |= got != plain or not same
print("DEFECT: the runtime's optimizer-step hook is traced by dynamo in a compiled opt.step" if bad else "ok")
sys.exit(1 if bad else 0)
