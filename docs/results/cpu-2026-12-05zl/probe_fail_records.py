"""Probe: fail20 has 191 step records for 190 completed steps + 10 failed ones. Which
record is the extra one? Runs the fail20 loop of soak.py (the middle block raises inside
its forward at every 20th step; the loop catches, zero_grad, skips) for 60 steps under
MODE, and prints each record's step number, phase, passes, peak bytes and notes around the
failures.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_fail_records.py MODE
"""
import sys
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/tmp/sweep_soak")
import torch
from soak import FAIL, build, batch
from tests.helpers import variant_runtime

MODE = sys.argv[1] if len(sys.argv) > 1 else "keep"
torch.set_num_threads(1)
m = build(fail=True)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
rt = variant_runtime(m, MODE)
failed = []
with rt:
    for step in range(60):
        torch.manual_seed(10 * step)
        FAIL["on"] = step % 20 == 19
        try:
            m(batch(10 * step, 2, 32)).backward()
        except RuntimeError:
            failed.append(step)
            opt.zero_grad(set_to_none=True)
            continue
        finally:
            FAIL["on"] = False
        opt.step()
        opt.zero_grad(set_to_none=True)
recs = rt.report().steps
print(f"mode={MODE}: failed steps {failed}; {60 - len(failed)} completed; {len(recs)} records")
for r in recs:
    if r.step >= 16 and r.step <= 22 or r.step >= 55:
        print(f"  record step={r.step} phase={r.phase} passes={r.passes} peak={r.peak_activation_bytes} "
              f"kept={r.kept_bytes} notes={r.notes}")
