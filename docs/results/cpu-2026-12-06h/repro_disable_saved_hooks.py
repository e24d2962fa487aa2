"""A loop that runs part of its work under torch.autograd.graph.disable_saved_tensors_hooks
(as torch internals and some libraries do) works plainly, but inside `with offrecomp.runtime`
torch raises the caller's own message, nothing naming offrecomp (its pair is registered from
entry to exit).  offrecomp names the analogous torch.func case; here the user gets only
their own text.  Exit 1 when the error does not name offrecomp."""
import sys; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp
class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x.sum()
m = Net()
with torch.autograd.graph.disable_saved_tensors_hooks("no saved-tensor hooks in this section"):
    m(torch.randn(2, 8)).backward()     # plain: fine
try:
    with offrecomp.runtime(m, mode="recompute"):
        with torch.autograd.graph.disable_saved_tensors_hooks("no saved-tensor hooks in this section"):
            m(torch.randn(2, 8)).backward()
    print("no error"); sys.exit(0)
except RuntimeError as e:
    print("RuntimeError:", e)
    sys.exit(0 if "offrecomp" in str(e) else 1)
