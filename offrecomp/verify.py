"""``OFFRECOMP_VERIFY=1``: check that replay regenerates what the forward saved.

At save time each dropped tensor gets a small fingerprint (sum, sum of squares and a
position-weighted sum of its finite values, and the counts and position-weighted sums
of its NaN, +inf and -inf, in float64, kept on the device); at unpack the replayed tensor's
fingerprint must match. A mismatch names the region, the call and the save index, which
catches forwards that are not deterministic functions of their inputs (data-dependent
routing, state changed between forward and backward). Costs a few reductions per
dropped tensor in forward and in backward; meant for debugging.
"""

from __future__ import annotations

import torch

from offrecomp.diagnostics import replay_differs
from offrecomp.state import RegionCall

__all__ = ["ReplayMismatchError", "Verifier", "fingerprint"]

# Replays on GPU may use other reduction orders (atomics); exact on CPU.
RTOL = 1e-4


class ReplayMismatchError(RuntimeError):
    pass


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Sum, sum of squares and a position-weighted sum of the finite values, then the
    counts of NaN, +inf and -inf and their position-weighted sums: a save holding
    non-finite values (an overflowing fp16 step) fingerprints alike on every run."""
    x = t.detach().reshape(-1).to(torch.float64)
    if x.numel() == 0:
        return torch.zeros(9, dtype=torch.float64, device=t.device)
    w = torch.arange(1, x.numel() + 1, device=x.device, dtype=torch.float64).remainder_(97.0)
    finite = torch.isfinite(x)
    f = torch.where(finite, x, 0.0)
    odd = [x.isnan(), x == float("inf"), x == float("-inf")]
    return torch.stack([
        f.sum(), (f * f).sum(), (f * w).sum(),
        *(m.sum().to(torch.float64) for m in odd), *((m * w).sum() for m in odd),
    ])


class Verifier:
    def __init__(self) -> None:
        self._prints: dict[tuple[int, int], torch.Tensor] = {}

    def record(self, call: RegionCall, index: int, t: torch.Tensor) -> None:
        with torch.no_grad():
            self._prints[(id(call), index)] = fingerprint(t)

    def check(self, call: RegionCall, index: int, t: torch.Tensor) -> None:
        want = self._prints.pop((id(call), index), None)
        if want is None:
            return
        with torch.no_grad():
            got = fingerprint(t)
        if not (
            torch.equal(got[3:], want[3:])
            and torch.allclose(got[:3], want[:3], rtol=RTOL, atol=1e-6 * max(1.0, float(want[:3].abs().max())))
        ):
            raise ReplayMismatchError(
                f"offrecomp: replay of region {call.name!r} (call {call.call_index}) regenerated "
                f"save #{index} with other values than the forward saved (fingerprint "
                f"{want.tolist()} vs {got.tolist()}). {replay_differs(verifying=True)}"
            )
