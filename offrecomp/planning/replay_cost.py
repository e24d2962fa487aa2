"""What a replay under the dispatch mode costs per op it sees (NOTE [Serving overhead]):
a starting guess, learnt from the replays that run unless the config pins it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from offrecomp.phases import Phase
from offrecomp.planning.profiling import own_distorted, own_seconds

if TYPE_CHECKING:
    from offrecomp.measure import Clock
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.state import PassState

log = logging.getLogger(__name__)

#: Host time the replay dispatch mode adds per op it sees, until the replays that run
#: teach the runtime its own figure. The mode itself costs about 8 us an op over plain on a
#: CPU host (benchmarks/bench_host_overhead.py); what replays show, learnt, was about 40
#: (the forward's Python around skipped ops included). See NOTE [Serving overhead].
SERVING_OVERHEAD_SECONDS = 25e-6
#: Regions a calibration pass replays under the dispatch mode (NOTE [Dispatch probe]) ...
DISPATCH_PROBES = 3
#: ... and the bounds of what they teach, as multiples of the starting guess.
PROBE_RANGE = (0.125, 4.0)


class ReplayCost:
    """The planner's figure for a dispatch-mode replay's cost per op, in seconds."""

    def __init__(self, pinned_us: float | None) -> None:
        self.pinned = pinned_us is not None
        """``Config.replay_op_us`` set it: never learnt."""
        self.seconds: float = pinned_us * 1e-6 if pinned_us is not None else SERVING_OVERHEAD_SECONDS
        self.probed = False
        """A calibration pass's probe replaced the starting guess (NOTE [Dispatch probe])."""

    # NOTE [Dispatch probe]
    # The cost per op is learnt from the dispatch-mode replays that run, but a plan runs
    # them only where the figure says they pay: with a starting guess too high for the
    # device (a long sequence on a GPU, whose replays are device-bound and hide the
    # mode's host work), no plan serves, nothing is learnt, and the guess prices serving
    # replays out for good. So the calibration pass, which replays every region plainly
    # to fit op times, replays up to DISPATCH_PROBES regions under the dispatch mode,
    # each one whose repeated peer it replayed plainly before: a probe's time, less its
    # ops' times fitted from that peer, per op it saw, is one sample; their median,
    # bounded to PROBE_RANGE times the guess (a single small replay on a loaded host can
    # read 0 or 40 times the truth), replaces the guess before the first plan (and any
    # plan solved with a figure it moves by more than half is solved again). Models
    # without repeated regions, and a pinned ``replay_op_us``, keep the guess.

    def observe(self, seconds: float, entries: Mapping[str, PlanEntry]) -> None:
        """NOTE [Dispatch probe]: the probes' cost per op, bounded, replaces the figure."""
        if self.pinned:
            return
        low, high = PROBE_RANGE
        self.seconds = min(max(seconds, low * SERVING_OVERHEAD_SECONDS), high * SERVING_OVERHEAD_SECONDS)
        self.probed = True
        self._solve_moved(entries)

    def learn(self, p: PassState, entries: Mapping[str, PlanEntry], clock: Clock) -> None:
        """NOTE [Serving overhead]: learn what the dispatch mode costs per op it sees.

        Each replay under the mode ran ops whose predicted seconds are known (scaled by
        how much faster or slower the pass's forward ran than the estimate's); the rest of
        its measured time, per op seen, is the mode's cost. Smoothed like the cost model
        (weight 0.3 on the newest pass, whose value counts for at most 4x the current
        one plus 20 us, so one outlying pass cannot swing it); a pinned ``replay_op_us`` is never changed, and
        passes whose op times are the recorder's (before calibration) teach nothing. A
        plan solved with a cost that has since moved by more than half (and 5 us) is
        solved again (``entries``), since which replays pay and what they cost both moved.
        """
        if self.pinned or not p.dispatch_replays:
            return
        entry = entries.get(p.signature)
        if p.phase == Phase.MEASURE or p.resigned_from or entry is None or not entry.calibrated:
            # the op times are the recorder's, or (NOTE [Pass signatures]) another signature's
            return
        # The ops' predicted times come from the estimate before this pass. When the
        # whole pass ran slower or faster (another process on the machine, clocks), so
        # did the ops it replayed: scale them by the pass's forward against the
        # estimate's, or that change would be taken for the mode's cost.
        slow = 1.0
        fwd = own_seconds(p, p.start_mark, p.backward_start_mark, clock)  # NOTE [Backwards of other passes] in profiling.py
        est = entry.profile.forward_seconds if entry.profile is not None else 0.0
        if (
            fwd
            and est > 0
            and int(getattr(p.offload_stats, "window_waits", 0) or 0) == 0  # waits are not compute
            and not own_distorted(p, p.start_mark, p.backward_start_mark, clock, fwd)
        ):
            slow = min(4.0, max(0.25, fwd / est))
        extra, ops = 0.0, 0
        for _, a, b, run, program in p.dispatch_replays:
            k = len(program)  # the ops it saw
            secs = clock.seconds(a, b)
            if secs is None or k <= 0 or clock.distorted(a, b, secs):
                continue  # NOTE [Host pauses]
            extra += secs - run * slow
            ops += k
        if ops == 0:
            return
        # one outlying pass moves the estimate by at most 4x the current value (plus 20 us)
        observed = min(max(0.0, extra / ops), 4.0 * self.seconds + 20e-6)
        self.seconds = 0.7 * self.seconds + 0.3 * observed
        self._solve_moved(entries)

    def _solve_moved(self, entries: Mapping[str, PlanEntry]) -> None:
        """Solve again the plans solved with a figure the current one moved by more than
        half (and 5 us)."""
        for entry in entries.values():
            if entry.plan is None or entry.needs_solve:
                continue
            old = entry.solved_replay_op_seconds
            if abs(self.seconds - old) > max(0.5 * old, 5e-6):
                entry.needs_solve = True
                log.info(
                    "offrecomp: replay dispatch cost now %.1f us per op (plan solved with %.1f); "
                    "solving signature %s again",
                    1e6 * self.seconds, 1e6 * old, entry.signature,
                )
