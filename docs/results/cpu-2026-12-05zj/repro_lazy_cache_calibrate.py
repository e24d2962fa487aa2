"""rope_lazy of sweep_zj.py alone: 3 pre-norm attention blocks whose RoPE cos/sin caches
(persistent=False buffers, n x 64 fp32) start at 64 rows and are replaced by larger
ones in forward when a longer sequence arrives; lengths 48, 64, 96, 128, 96, 200, 200, 128
(batch 2). Under mode="auto" (default replay_op_us) the calibrate steps hold 0.57-1.10 MiB
more by the CPU allocator than mode="recompute" at the same books; the same model with a
512-row cache from the start (no replacement) does not. Gradients stay bitwise.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zj/repro_lazy_cache_calibrate.py
Exits 1 while a calibrate step of the lazily grown model holds over 128 KiB more than
recompute's at equal books.
"""
import copy, os, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.getcwd())
import offrecomp
from sweep_zj import LM, LAZY, diff, simple, train


def run(rows):
    fn = simple(LAZY)
    torch.manual_seed(0)
    base = LM(3, rope_buf=rows)
    ref, _, _ = train(copy.deepcopy(base), fn, len(LAZY), alloc=False)
    out = {}
    for mode in ("recompute", "auto"):
        m = copy.deepcopy(base)
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
        got, pk, _ = train(m, fn, len(LAZY), rt)
        out[mode] = (pk, rt.report().steps, not diff(ref, got))
    (rp, rr, rs), (ap, ar, as_) = out["recompute"], out["auto"]
    print(f"cache of {rows} rows at start; lengths {LAZY}; bitwise recompute {rs}, auto {as_}")
    print(" step  len  auto phase   books(auto)  books(rec)  alloc(auto)  alloc(rec)  excess KiB")
    bad = []
    for i, T in enumerate(LAZY):
        ex = ap[i] - rp[i]
        print(f" {i:4d} {T:4d}  {ar[i].phase:11s} {ar[i].peak_activation_bytes:11d} {rr[i].peak_activation_bytes:11d}"
              f" {ap[i]:12d} {rp[i]:11d} {ex / 1024:10.0f}")
        if ar[i].phase == "calibrate" and ar[i].peak_activation_bytes == rr[i].peak_activation_bytes and ex > 128 << 10:
            bad.append(i)
    return bad


if __name__ == "__main__":
    torch.set_num_threads(1)
    bad = run(64)
    print()
    ctrl = run(512)
    if bad:
        print(f"\nDEFECT: calibrate steps {bad} hold >128 KiB more than recompute at equal books (512-row control: {ctrl or 'none'})")
        sys.exit(1)
    print("\nOK")
