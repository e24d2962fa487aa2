"""Probe: how much of recompute's allocator peak in repro_snn_membrane_copies.py is the
CPU generator state each region call captures for its replay (torch.get_rng_state(): a
5,056-byte tensor per call on the CPU)? Runs recompute twice: as is, and with
torch.get_rng_state answering one shared tensor (the model draws no random numbers, so
the replays compute the same).
    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zh/probe/p_rng_state_bytes.py"""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import io, contextlib, torch, offrecomp
src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "repro_snn_membrane_copies.py")).read()
src = src.split("plain_peaks, ref = run(net())")[0]
ns = {"__name__": "repro"}; exec(compile(src, "repro", "exec"), ns)
print("torch.get_rng_state() bytes:", torch.get_rng_state().numel())
for shared in (False, True):
    orig = torch.get_rng_state
    if shared:
        one = orig(); torch.get_rng_state = lambda: one
    try:
        m = ns["net"](); rt = offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=ns["Leaky"])
        peaks, _ = ns["run"](m, rt)
    finally:
        torch.get_rng_state = orig
    calls = 18
    print(f"recompute, {'one shared generator state' if shared else 'a generator state per call'}: allocator {peaks}, "
          f"books {[s.peak_activation_bytes for s in rt.report().steps]}")
