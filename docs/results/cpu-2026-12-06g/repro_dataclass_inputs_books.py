"""Region inputs handed to blocks inside a dataclass (an argument object, not a pytree)
are held for the replay by the captured object, yet mode='recompute' (and 'offload', and
auto's measuring pass) books their saves as dropped activations: peak_activation_bytes
understates what is held. The same model passing the tensor directly books them as kept
region inputs. Exits 1 while the books miss them."""
import sys, os, dataclasses, gc, weakref
sys.path.insert(0, os.environ.get("ORC", str(__import__("pathlib").Path(__file__).resolve().parents[3])))  # the repository root
import torch, torch.nn as nn
import offrecomp

D, N, BLOCKS = 256, 64, 4

@dataclasses.dataclass
class State:
    h: torch.Tensor

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(D, D)
    def forward(s, st: State) -> State:
        return State(torch.tanh(s.a(st.h)))   # Linear saves st.h (the block's input)

class Model(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
    def forward(s, x, refs):
        st = State(x * 1.0)
        for b in s.blocks:
            refs.append(weakref.ref(st.h))
            st = b(st)
        return st.h.sum()

torch.manual_seed(0)
m = Model()
bad = False
for mode in ["recompute", "offload"]:
    with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
        for i in range(3):
            refs = []
            loss = m(torch.randn(N, D), refs)
            gc.collect()
            held = sum(r().untyped_storage().nbytes() for r in refs if r() is not None)
            loss.backward(); m.zero_grad()
    st = rt.report().steps[-1]
    print(f"{mode}: block inputs still held after forward: {held} B; booked peak {st.peak_activation_bytes} B, "
          f"kept {st.kept_bytes} B, offloaded {st.offloaded_bytes} B, recomputed {st.recomputed_bytes} B")
    if st.peak_activation_bytes < held:
        print(f"  DEFECT: booked peak is below the bytes of block inputs the runtime itself holds for replay")
        bad = True
sys.exit(1 if bad else 0)
