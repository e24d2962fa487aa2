"""The placement optimiser: a memory budget in, the plan with the least predicted step time out.

How it works (details in docs/planner.md):

1. **Hidden offload set.** Storages that may be offloaded are ranked by how expensive
   they are to recompute per byte (region inputs and root storages first: they cannot
   be recomputed). Walking that ranking, a storage joins the set when, with everything
   already in it, every D2H copy still lands before backward starts and every reload
   still lands before its region's backward needs it (checked incrementally: a segment
   tree for the D2H FIFO, a FIFO propagation for the H2D stream). Offloading a member
   costs no time in the model; a storage of the last regions, whose reload would only
   stall, never qualifies.
2. **Chain of plans.** From all-KEEP, each step simulates the current plan, finds the
   time of its memory peak and frees about ``delta`` bytes *at that time*, cheapest
   seconds per byte first: hidden-set members that are off the device then (free),
   offloads that may stall (priced by the stall they add to their region), and drops.
   Drops are priced per region knowing the shared replay prefix: for every prefix end
   ``K`` an option pays the ops before ``K`` that are not served plus the producers of
   what it drops. A step that overshoots also records a side plan that frees the same
   bytes with the single cheapest option. A step that only moves the peak is undone and
   its moves banned; when the chain stalls it continues with drops only.
3. **Frugal plans.** Dropping every droppable storage, with and without offloading
   every offloadable one.
4. **Peak descent** (NOTE [peak descent] in ``family``): from the lowest-peak plan,
   single storage changes near the peak that lower it, while one does.
5. **Local search** (profiles of at most ``REFINE_MAX_STORAGES`` storages): every plan
   one storage change (two on tiny profiles) away from a plan on the time/peak Pareto
   frontier is simulated, until the frontier stops changing.
6. **Offload families** (NOTE [Offload families] in ``family``): where offloads are
   legal, steps 2-5 run again with drops only (the plan without offloads is then a
   member), and chains of drops start from all-KEEP with the first half and all of
   a hidden set (ranked by producer op seconds per byte) offloaded.
7. **Pick.** Every plan of that family has been simulated once; the answer is the
   fastest one whose peak fits the budget (and whose offloads fit the host limit). The
   family does not depend on the budget, so a larger budget never gives a slower plan.

The package, one module per mechanism: ``api`` (``solve``, ``exhaustive_solve``, the
pick), ``family`` (the family of plans and the chain's loop), ``hidden`` (step 1's set),
``chain`` (one chain step), ``drops`` (pricing drops). The kernels' array names are the
legend's in ``scheduler.kernels``. ``_build_family`` is re-exported for the tests.
"""

from scheduler.solver.api import InfeasibleBudgetError, exhaustive_solve, solve
from scheduler.solver.family import _build_family as _build_family

__all__ = ["InfeasibleBudgetError", "exhaustive_solve", "solve"]
