"""Probe: what the offload engine still holds after exit in sweep_z's attr_on_module_arg
case (each block keeps ``self.last = tanh(y)``, a tensor with a graph, on itself) and
attr_activation case (the blocks store ``holder.t = tanh(y)`` on a shared holder object),
and after those attributes are set to None.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05z/probe_attr_groups_after.py"""
import gc
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, sweep_z.py
import harness  # noqa: F401  (sets threads, sys.path)
import offrecomp
import sweep_z
import torch


def clear_own(m):
    for b in m.blocks:
        b.last = None


def clear_holder(m):
    m.holder_obj.t = None


for name, build, loop, clear in [
    ("attr_on_module_arg", lambda: sweep_z.OwnAttrNet(False), sweep_z.loop_std, clear_own),
    ("attr_activation", sweep_z.attr_net, sweep_z.loop_attr, clear_holder),
]:
    torch.manual_seed(0)
    m = build()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    with rt:
        for step in range(4):
            loop(m, step)
            m.zero_grad(set_to_none=True)
    eng = rt.offload_engine
    gc.collect()
    print(name, "after exit:", "live_groups", eng.live_groups, "device_bytes", eng.device_bytes,
          "offload_groups_held", rt.offload_groups_held)
    clear(m)
    gc.collect()
    print(name, "after the attribute is set to None:", "live_groups", eng.live_groups,
          "device_bytes", eng.device_bytes, "offload_groups_held", rt.offload_groups_held)
    rt.close()
