"""Shared by the repros: the allocator's peak of one step (test_memory's allocator_peak),
after warm-up steps in the same runtime, and the non-activation overhead of a plain step."""
import copy, os, sys
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
torch.set_num_threads(1)
import offrecomp
from tests.offrecomp.test_memory import allocator_peak


def step_fn(model, batch, autocast=False):
    def run():
        torch.manual_seed(1)
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(batch).float()
        else:
            loss = model(batch)
        loss.backward()
    return run


def plain_saved(model, batch, autocast=False):
    seen = {}
    def pack(t):
        if not isinstance(t, torch.nn.Parameter) and not isinstance(t._base, torch.nn.Parameter):
            s = t.untyped_storage(); seen[s.data_ptr()] = s.nbytes()
        return t
    m = copy.deepcopy(model)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step_fn(m, batch, autocast)()
    return sum(seen.values())


def measure(model, batch, autocast=False, warm=4, **kw):
    """(allocator peak of the step after ``warm`` steps, its step record) under a runtime
    (kw) or plainly (kw empty: record None)."""
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    run = step_fn(m, batch, autocast)
    if not kw:
        for _ in range(warm):
            run()
        return allocator_peak(run), None
    with offrecomp.runtime(m, **kw) as rt:
        for _ in range(warm):
            run()
        peak = allocator_peak(run)
    return peak, rt.report().steps[-1], rt
