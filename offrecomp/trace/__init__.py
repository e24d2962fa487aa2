"""Op-level view of a region: recorded once per signature, used to make replay cheap.

The measuring pass runs each region's forward under ``OpRecorder``, a dispatch mode that
sees every ATen op below autograd: its time, the allocations it reads and creates, the
view geometry of its outputs, whether it writes its inputs, draws random numbers, hands
a value to Python, or runs with grad disabled. From that trace and the saves the hooks
saw, ``build_structure`` derives a ``RegionStructure`` for the planner and for replay,
and ``ServingMode`` carries out its replay program (NOTE [Which ops replay runs]).

One module per mechanism; imports run one way, top to bottom:

* ``scope``: what the modes see (``internal``/``user_code``) and their shared base;
* ``ops``: what the modes ask of an op (traits per operator, argument leaves, the
  tensors it writes, parameter casts: NOTE [Op leaves], NOTE [Autocast cache]);
* ``recorder``: ``OpRecorder`` and ``FirstCallWatch``, and what they record;
* ``structure``: ``build_structure``, ``RegionStructure`` and its replay program
  (NOTE [Which ops replay runs]);
* ``serving``: ``ServingMode`` and ``ParamGuard``, the modes a replay runs under.
"""

from offrecomp.trace.ops import op_leaves, op_name
from offrecomp.trace.recorder import COMPILED_FORWARD, FirstCallWatch, OpRecorder
from offrecomp.trace.scope import PassiveMode, ThreadDepth, internal, user_code, user_dispatch_modes
from offrecomp.trace.scope import _is_internal as _is_internal
from offrecomp.trace.serving import (
    CastDivergedError,
    ParamGuard,
    PlaceholderReadError,
    ReplayDivergedError,
    ServingMode,
)
from offrecomp.trace.structure import (
    PLACEHOLDER,
    RUN,
    SERVE,
    RegionStructure,
    SaveInfo,
    build_structure,
)

__all__ = [
    # recording
    "COMPILED_FORWARD",
    "FirstCallWatch",
    "OpRecorder",
    # region structure and the replay program
    "PLACEHOLDER",
    "RUN",
    "SERVE",
    "RegionStructure",
    "SaveInfo",
    "build_structure",
    # serving
    "CastDivergedError",
    "PlaceholderReadError",
    "ParamGuard",
    "ReplayDivergedError",
    "ServingMode",
    # what the modes see, and of an op
    "PassiveMode",
    "ThreadDepth",
    "internal",
    "op_leaves",
    "op_name",
    "user_code",
    "user_dispatch_modes",
]
