"""The memory in a list held inside a tuple attribute of the argument object
(state.t = ([mem],)): recompute silently gives other gradients (without the tuple,
state.t = [mem], it is bitwise)."""
import sys, types; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _repro_common import *
TUPLE = "--no-tuple" not in sys.argv
if TUPLE:
    run(lambda: types.SimpleNamespace(t=([None],)), lambda st: st.t[0][0], lambda st, v: st.t[0].__setitem__(0, v), "state.t = ([mem],)")
else:
    run(lambda: types.SimpleNamespace(t=[[None]]), lambda st: st.t[0][0], lambda st, v: st.t[0].__setitem__(0, v), "state.t = [[mem]]")
