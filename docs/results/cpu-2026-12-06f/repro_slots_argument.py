"""A memory carried from block to block through an argument object whose class uses
__slots__ (@dataclass(slots=True)): recompute silently gives other gradients."""
import sys; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _repro_common import *
from dataclasses import dataclass

@dataclass(slots=True)
class State:
    mem: torch.Tensor | None = None

run(State, lambda st: st.mem, lambda st, v: setattr(st, "mem", v), "slots dataclass state")
