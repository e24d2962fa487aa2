"""Repro: regional compilation the README recommends, `model.blocks[i] = torch.compile(block)`,
done while the runtime is entered (before the first step, or after warm-up steps), or
between two entries of the same runtime: from then on the blocks are never recomputed
(mode="recompute": replays 0, recomputed_bytes 0, peak = keep's peak), with no warning
under recompute (auto only warns later that its plan ran over budget). Gradients stay
bitwise. The same thing with `block.compile()` (in place) IS followed (NOTE [Compiled
regions], CHANGELOG "A block compiled in place while entered"), and _check_regions' doc
says "a block wrapped still runs as its region".

Run: cd /tmp/sweep_compile && OMP_NUM_THREADS=1 /work/main/.venv/bin/python repro_wrap_inside.py
Exits 1 while the defect exists."""
import copy
import logging
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
msgs = []


class H(logging.Handler):
    def emit(self, r):
        msgs.append(r.getMessage())


logging.getLogger("offrecomp").addHandler(H())


def wrap(m):
    for i, b in enumerate(m.blocks):
        m.blocks[i] = torch.compile(b, backend="aot_eager")


def inplace(m):
    for b in m.blocks:
        b.compile(backend="aot_eager")


def run(how, when):
    torch._dynamo.reset()
    msgs.clear()
    m = copy.deepcopy(base)
    if when == "before":
        how(m)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with rt:
        for s in range(4):
            if when == "inside_step2" and s == 2:
                how(m)
            m(torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))).backward()
    if when == "between_entries":
        how(m)
        with rt:
            m(torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(9))).backward()
    st = rt.report().steps
    return [s.replays for s in st], st[-1].recomputed_bytes, st[-1].peak_activation_bytes, len(msgs)


bad = False
for how in (wrap, inplace):
    for when in ("before", "inside_step2", "between_entries"):
        reps, rec, peak, nwarn = run(how, when)
        ok = reps[-1] == 2
        print(f"{how.__name__:8s} {when:16s}: replays per step {reps}, last step recomputed {rec} B, peak {peak} B, "
              f"offrecomp warnings {nwarn} -> {'ok' if ok else 'NOT RECOMPUTED'}")
        bad |= not ok
print("DEFECT: blocks wrapped by torch.compile while the runtime is entered are silently not recomputed" if bad else "ok")
sys.exit(1 if bad else 0)
