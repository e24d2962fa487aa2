"""A block using a functional collective (torch.distributed._functional_collectives.all_reduce,
as DTensor/TP code does) crashes under mode="recompute": the replay's pack calls
_fillable on the AsyncCollectiveTensor (a wrapper subclass) and storage.data_ptr() raises.
Seen on 2 gloo ranks in dh.py (sync_funcol); reduced here to one gloo rank."""
import sys, os, datetime, copy, traceback
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import offrecomp

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        s = fc.all_reduce(y.detach().abs().mean().reshape(1), "sum", dist.group.WORLD)
        y = y * s  # mul saves s (an AsyncCollectiveTensor) for y's gradient
        return self.out(y)  # a later save: the replay runs past the mul


torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(3)])
ref = copy.deepcopy(model)
x = torch.randn(4, 16)
ref(x).sum().backward()
rc = 1
try:
    with offrecomp.runtime(model, mode="recompute", min_bytes=0):
        model(x).sum().backward()
    ok = all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), model.parameters()))
    print("gradients equal:", ok)
    rc = 0 if ok else 1
except Exception as e:
    traceback.print_exc()
    print("DEFECT:", type(e).__name__, e)
dist.destroy_process_group()
sys.exit(rc)
