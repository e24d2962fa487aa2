"""Forced offload with copies slower than the forward, reloading every group (the
engine's behaviour with ``OffloadEngine.serve_held = False``) against serving the groups
still held when backward reaches them (NOTE [Served groups] in offrecomp/transfer.py),
beside keep; booked peaks and step times, gradients checked bitwise against plain.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-07c/served_peak.py [COPY_DELAY_S] [MODEL]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import offrecomp  # noqa: E402
from offrecomp.backends import EmulatedBackend  # noqa: E402
from offrecomp.offload import OffloadEngine  # noqa: E402
from tests.helpers import assert_bitwise, make, train, twin  # noqa: E402

delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.005
name = sys.argv[2] if len(sys.argv) > 2 else "gpt_dropout"
init = EmulatedBackend.__init__
EmulatedBackend.__init__ = lambda self: init(self, copy_delay_s=delay)  # type: ignore[method-assign]
model, batch = make(name)
ref = train(twin(model), batch, steps=4)
print(f"{name}, emulated copies of {delay * 1e3:.1f} ms each, 4 steps")
for label, mode, serve in (("keep", "keep", True), ("offload, reloading", "offload", False),
                           ("offload, serving", "offload", True)):
    OffloadEngine.serve_held = serve
    m = twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    t0 = time.perf_counter()
    got = train(m, batch, rt, steps=4)
    wall = time.perf_counter() - t0
    assert_bitwise(ref, got)
    steps = rt.report().steps
    peaks = [s.peak_activation_bytes // 1024 for s in steps]
    print(f"  {label:20s} peaks {peaks} KiB, h2d {sum(s.h2d_bytes for s in steps) // 1024} KiB, "
          f"served groups {sum(s.served_groups for s in steps)}, {wall * 1e3:.0f} ms, bitwise")
