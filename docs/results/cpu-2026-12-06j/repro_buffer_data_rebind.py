"""A region whose forward reads a buffer larger than 64 KiB (32k floats), and the loop
changes that buffer between the forward and its backward: `buf.data = other` (moves no
version counter, keeps the tensor object), an in-place write (`buf.add_(1)`, moves the
version), or an in-place write through `.data` (`buf.data.add_(1)`, moves none). Plain
autograd saved `x + buf` (the add saves nothing), so its gradients use the old values,
and a replay recomputes the sum from the buffer.  Prints, per change and mode, whether gradients equal plain's or what was raised.
Exit 1 when gradients differ silently after `rebind` (`data_inplace` is a known limit,
docs/reliability.md: a write through `.data` moves no version, for parameters too)."""
import sys, copy; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp

N = 32 * 1024  # 128 KiB of float32: over READ_SNAPSHOT_MAX_BYTES (64 KiB)
if len(sys.argv) > 1: N = int(sys.argv[1])

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(N // 64, N // 64)
        s.register_buffer("scale", torch.rand(64, N // 64) + 0.5)
    def forward(s, x):
        return torch.tanh(s.fc(x + s.scale)) + x   # the add saves nothing; fc saves x + scale

class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x.pow(2).sum()

def change(model, how):
    for b in model.blocks:
        if how == "rebind": b.scale.data = b.scale.data * 2.0
        elif how == "inplace": b.scale.add_(1.0)
        elif how == "data_inplace": b.scale.data.add_(1.0)

def run(model, rt, how):
    x = torch.randn(64, N // 64, generator=torch.Generator().manual_seed(0))
    if rt is None:
        y = model(x); change(model, how); y.backward()
    else:
        with rt:
            y = model(x); change(model, how); y.backward()
    return [p.grad.clone() for p in model.parameters()]

torch.manual_seed(0); base = Net()
bad = False
for how in ["rebind", "inplace", "data_inplace"]:
    ref = run(copy.deepcopy(base), None, how)
    for mode in ["keep", "recompute", "auto"]:
        m = copy.deepcopy(base)
        try:
            got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0), how)
        except RuntimeError as e:
            print(f"{how:13s} {mode:9s} raised: {str(e)[:300]}"); continue
        ok = all(torch.equal(a, b) for a, b in zip(ref, got))
        print(f"{how:13s} {mode:9s}", "equal to plain" if ok else "WRONG GRADIENTS"); bad |= not ok and how != "data_inplace"
sys.exit(1 if bad else 0)
