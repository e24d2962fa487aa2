"""Aliasing between a region's arguments and state it reaches otherwise:
  param_arg     block(x, block.fc.weight): its own parameter as an argument, read both ways
  param_is      the same, the block branching on `w is self.fc.weight`
  param_write   the same, the block renormalising the argument in place under no_grad
                (read after through self.fc)
  tied_head     a head region handed the embedding weight it also owns (tied): head(h, emb.weight)
  tuple_attr    block(x, State(hs=(x,))): a tuple an argument object holds aliases a tensor
                argument; the block branches on `state.hs[0] is x`
  tuple_write   the same, the block writing x in place and reading state.hs[0]
  tuple_read_first  the same, reading state.hs[0] before writing x
  mixed_dtype   block(x, x.view(torch.int32)): one storage in two dtypes, the float one
                written in place
  conj_write    block(z, z.conj()): a complex input and its conjugate view, z written in place
Per case and mode: gradients equal plain's, wrong, or what was raised.  Exit 1 when any
gradient differs silently."""
import sys, copy, contextlib, dataclasses; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp

@dataclasses.dataclass
class State:
    hs: tuple

class ParamArg(nn.Module):
    def __init__(s, how):
        super().__init__(); s.fc = nn.Linear(16, 16); s.how = how
    def forward(s, x, w):
        if s.how == "param_is":
            scale = 1.0 if w is s.fc.weight else 0.5
            return torch.tanh(s.fc(x) * scale) + x
        if s.how == "param_write":
            with torch.no_grad():
                w.mul_(0.9)                 # the parameter, written in place
        return torch.tanh(s.fc(x) + x @ w.t()) + x

class TupleAttr(nn.Module):
    def __init__(s, how):
        super().__init__(); s.fc = nn.Linear(16, 16); s.how = how
    def forward(s, x, state):
        if s.how == "tuple_attr":
            scale = 1.0 if state.hs[0] is x else 0.5
            return torch.tanh(s.fc(x) * scale) + x
        if s.how == "tuple_read_first":
            y = state.hs[0] * 3.0            # read through the tuple before the write
            x.mul_(2.0)
            return torch.tanh(s.fc(y)) + x
        x.mul_(2.0)                          # through the argument
        return torch.tanh(s.fc(state.hs[0])) # read through the tuple: plain sees the write

class Mixed(nn.Module):
    def __init__(s, how):
        super().__init__(); s.fc = nn.Linear(16, 16); s.how = how
    def forward(s, x, other):
        if s.how == "mixed_dtype":
            x.mul_(2.0)
            return torch.tanh(s.fc(x)) + (other & 1).float()
        x.mul_(2.0)
        y = torch.view_as_real(other.resolve_conj()).flatten(-2)[..., :16]
        return torch.tanh(s.fc(y))

class Net(nn.Module):
    def __init__(s, how):
        super().__init__(); s.how = how; s.inp = nn.Linear(16, 16)
        blk = ParamArg if how.startswith("param") else TupleAttr if how.startswith("tuple") else Mixed
        s.blocks = nn.ModuleList([blk(how) for _ in range(2)])
    def forward(s, x):
        x = s.inp(x)
        for b in s.blocks:
            x = x * 1.0
            if s.how.startswith("param"):
                x = b(x, b.fc.weight)
            elif s.how.startswith("tuple"):
                x = b(x, State(hs=(x,)))
            elif s.how == "mixed_dtype":
                x = b(x, x.view(torch.int32))
            else:
                z = torch.complex(x, x * 0.5)
                x = b(z, z.conj())
        return x.pow(2).sum()

class Tied(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(32, 16); s.blocks = nn.ModuleList([ParamArg("param_arg")])
        s.head = Head(s.emb)
    def forward(s, idx):
        h = s.emb(idx)
        for b in s.blocks: h = b(h, b.fc.weight)
        return s.head(h, s.emb.weight).logsumexp(-1).sum()

class Head(nn.Module):
    def __init__(s, emb):
        super().__init__(); s.norm = nn.LayerNorm(16); s.proj = nn.Linear(16, 32, bias=False); s.proj.weight = emb.weight
    def forward(s, h, w):
        return s.proj(torch.tanh(s.norm(h))) + torch.tanh(s.norm(h)) @ w.t()

def run(model, ctx, tied):
    with ctx:
        for step in range(2):
            model.zero_grad(set_to_none=True)
            g = torch.Generator().manual_seed(step)
            x = torch.randint(0, 32, (4, 6), generator=g) if tied else torch.randn(4, 16, generator=g)
            model(x).backward()
    return [p.grad.clone() for p in model.parameters()]

bad = False
cases = ["param_arg", "param_is", "param_write", "tied_head", "tuple_attr", "tuple_write", "tuple_read_first", "mixed_dtype", "conj_write"]
for how in (sys.argv[1:] or cases):
    torch.manual_seed(0); base = Tied() if how == "tied_head" else Net(how)
    try:
        ref = run(copy.deepcopy(base), contextlib.nullcontext(), how == "tied_head")
    except RuntimeError as e:
        print(f"{how:12s} plain raised: {str(e)[:200]}"); continue
    for mode in ["keep", "offload", "recompute", "auto"]:
        m = copy.deepcopy(base)
        try:
            got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0, regions=(lambda mod, name: name in ("blocks.0", "head")) if how == "tied_head" else None), how == "tied_head")
        except RuntimeError as e:
            print(f"{how:12s} {mode:9s} raised: {str(e)[:400]}"); continue
        ok = all(torch.equal(a, b) for a, b in zip(ref, got))
        print(f"{how:12s} {mode:9s}", "equal to plain" if ok else "WRONG GRADIENTS (max diff %.3g)" % max((a - b).abs().max().item() for a, b in zip(ref, got)))
        bad |= not ok
sys.exit(1 if bad else 0)
