"""Serving: the modes a replay runs under.

``ServingMode`` carries out a ``RegionStructure.program``: it runs, serves from held
storages, or hands out placeholders for each op, and checks that the replay dispatches
what the recording saw (NOTE [Which ops replay runs] in structure.py), raising
``ReplayDivergedError`` where it does not. ``ParamGuard`` stops a replay that would read
a parameter modified since the forward.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from offrecomp.trace.ops import (
    _TO_COPY,
    _param_cast,
    _scalars_of,
    _traits,
    _unflatten_like,
    describable,
    op_leaves,
    op_name,
)
from offrecomp.trace.recorder import HearsReportedWrites, _Value
from offrecomp.trace.scope import _is_internal, _RegionMode
from offrecomp.trace.structure import RUN, SERVE, RegionStructure

log = logging.getLogger(__name__)


class ReplayDivergedError(RuntimeError):
    """A replay did not dispatch what the recorded forward dispatched."""


class PlaceholderReadError(ReplayDivergedError):
    """A replay under the serving mode read or saved a placeholder (NOTE [Placeholder
    guard]): the recording missed a value path, and a replay without placeholders is
    right."""


class CastDivergedError(ReplayDivergedError):
    """A replay under the serving mode diverged at a cast of a parameter, which autocast's
    weight cache explains (NOTE [Autocast cache]): a plain replay is right."""


class ParamGuard(HearsReportedWrites):
    """Raises when an op of the replay reads a parameter, buffer or tensor of the
    argument state modified in place since the forward (NOTE [Replay and parameters] in
    params.py, NOTE [State written after the forward] in arg_state.py); ops the serving
    mode serves are not seen."""

    def __init__(self, region_name: str, modified: dict[int, str]) -> None:
        super().__init__()
        self.region_name = region_name
        self.modified = modified

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for t in op_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and describable(t):
                self._check(t, func)
        return func(*args, **(kwargs or {}))

    def reported_write(self, t: torch.Tensor) -> None:
        """Compiled code of the replay wrote ``t`` in place, unseen by the mode (NOTE
        [Storages no op made] in recorder.py)."""
        if describable(t):
            self._check(t, None)

    def _check(self, t: torch.Tensor, func: Any) -> None:
        """Raise if ``t`` is one of the modified tensors, read by op ``func`` (None:
        written by compiled code)."""
        what = self.modified.get(int(t.untyped_storage().data_ptr()))
        if what is not None:
            how = f"reads it ({func})" if func is not None else "writes it in compiled code"
            raise RuntimeError(
                f"offrecomp: {what} in region {self.region_name!r} was modified in place "
                f"since the region's forward read it, and replaying the region {how}, "
                "so it would produce other activations than the forward's. Hint: update "
                "parameters, buffers and the state a block's arguments hold after backward "
                "(optimizer.step()), not between forward and backward, or keep this "
                "region's activations (regions=)."
            )


class ServingMode(_RegionMode):
    """During replay: run, serve or stub each op per the program; check the op sequence."""

    def __init__(
        self,
        *,
        region_name: str,
        structure: RegionStructure,
        program: Sequence[int],
        storage_tensors: dict[int, tuple[Any, int]],
        generators: Sequence[torch.Generator] = (),
    ) -> None:
        super().__init__()
        self.region_name = region_name
        self.generators = generators
        """The generators whose states the call captured at entry, set by the replay: an
        op drawing from another one would draw other numbers than the forward did."""
        self.structure = structure
        self.program = program
        self.storage_tensors = storage_tensors
        self.index = 0
        self.before_op: Callable[[Any], None] | None = None
        """Called with each op before it runs, once set: the replay's early stop (NOTE
        [Replay] in offrecomp/replay.py) raises from it."""
        self.ran = 0  # compute ops run (views excluded)
        self.served = 0
        self.stubbed = 0
        # NOTE [Placeholder guard]: addresses of the placeholders' storages while they
        # live (each leaves the set when its storage is freed, so a later allocation at
        # that address is not mistaken for one; holding them instead would grow the
        # replay's memory). No op that runs may read one's values (ops that read only
        # shape and dtype, like empty_like in dropout, may take one), and no save may
        # capture one: if either happens, this pass took another path through the
        # region's code than the recording, and the replay is redone plainly.
        self._placeholders: set[int] = set()
        self.diverged: ReplayDivergedError | None = None
        """The divergence this replay raised (here or in its pack hook), in case code
        between it and the replay (as TorchScript does) turns it into another error."""
        self._build: tuple[int, int, list[tuple[str, tuple[Any, ...]]]] | None = None
        """NOTE [Skipped builds]: while the replay's ops after a skip are still inside the
        skipped run: the run's first op, the op the replay went on at, and the name and
        non-tensor arguments of each op the replay ran from there."""

    def diverge(self, msg: str, *, cast: bool = False, placeholder: bool = False) -> ReplayDivergedError:
        """Record a divergence; the caller raises what it returns. ``cast``: at a parameter
        cast (NOTE [Autocast cache]); ``placeholder``: a placeholder read or saved."""
        kind = CastDivergedError if cast else PlaceholderReadError if placeholder else ReplayDivergedError
        self.diverged = kind(msg)
        return self.diverged

    def _skip_build(self, k: int, name: str, scalars: tuple[Any, ...]) -> int:
        """NOTE [Skipped builds]: the recorded op the replay's op goes on at, past a build
        its forward took from a cache, or -1. A run whose ops go on at another op of the
        same name and arguments than the one the replay went on at (a slice of the
        table both the build and every call take) is tried again at the next such op."""
        st = self.structure
        if self._build is not None:
            k0, went_on, trail = self._build
            self._build = None
            m, j = len(trail), went_on
            while (j := st.skip_build(k0, trail[0][0], trail[0][1], after=j)) >= 0:
                at = j + m
                if at < min(len(st.op_names), len(st.op_scalars)) and all(
                    (st.op_names[j + i], st.op_scalars[j + i]) == trail[i] for i in range(m)
                ) and (st.op_names[at], st.op_scalars[at]) == (name, scalars):
                    st.skipped_builds += j - went_on
                    self._build = (k0, j, trail)
                    self.index = at + 1
                    return at
        j = st.skip_build(k, name, scalars)
        if j < 0:
            return -1
        if not st.skipped_builds:
            log.info(
                "offrecomp: a serving replay of region %r skips recorded ops %d-%d (%s ...): "
                "they built a tensor its forward now takes from a cache",
                self.region_name, k, j - 1, st.op_names[k] if k < len(st.op_names) else None,
            )
        st.skipped_builds += j - k
        self._build = (k, j, [])
        self.index = j + 1
        return j

    def _follow(self, k: int, name: str, scalars: tuple[Any, ...]) -> None:
        """The replay ran ``name`` at recorded op ``k`` after a skip: the skip holds once an
        op reads what the run did not make (no later op of the run can be where the replay
        goes on), or after 64 ops."""
        assert self._build is not None
        k0, _, trail = self._build
        roots = self.structure.build_roots
        if k >= len(roots) or roots[k] < k0 or len(trail) >= 64:
            self._build = None
        else:
            trail.append((name, scalars))

    def _known(self, g: torch.Generator) -> bool:
        """Is ``g`` one of the call's captured generators? The dispatcher hands a mode a new
        Python object for a generator, so it is told by its state, which the replay set."""
        state = g.get_state()
        return any(c.device == g.device and torch.equal(c.get_state(), state) for c in self.generators)

    def is_placeholder(self, t: torch.Tensor) -> bool:
        """True when ``t`` lies in a placeholder's storage (its values are garbage)."""
        if not self._placeholders or t.numel() == 0 or not describable(t):
            return False
        return t.untyped_storage().data_ptr() in self._placeholders

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _is_internal():
            return func(*args, **kwargs)
        if self.before_op is not None:
            self.before_op(func)
        k = self.index
        self.index += 1
        st = self.structure
        expected = st.op_names[k] if k < len(st.op_names) else None
        name = op_name(func)
        if name == _TO_COPY:
            cast_of = _param_cast(name, args, kwargs)
            recorded = st.param_casts.get(k, 0)
            if cast_of and cast_of != recorded:
                # NOTE [Autocast cache]: the forward found this cast in autocast's cache
                self.index = k
                return func(*args, **kwargs)
            if recorded and not cast_of:
                raise self.diverge(
                    f"offrecomp: replay of region {self.region_name!r} diverged at op {k}: the "
                    "recorded forward cast a parameter there, the replay casts another tensor",
                    cast=True,
                )
        if expected != name:
            j = self._skip_build(k, name, _scalars_of(op_leaves((args, kwargs))))
            if j >= 0:
                k, expected = j, name
        if expected != name:
            raise self.diverge(
                f"offrecomp: replay of region {self.region_name!r} diverged at op {k}: the recorded "
                f"forward ran {expected or '<nothing>'}, the replay ran {name}",
                cast=k in st.param_casts,  # a recorded parameter cast the replay does not make
            )
        # inside a skipped run the replay runs every op: it may yet go on elsewhere
        action = self.program[k] if k < len(self.program) and self._build is None else RUN
        # an op that reads no tensor is what its arguments make: checked before it is served
        if action == RUN or (k < len(st.build_roots) and st.build_roots[k] == k):
            leaves = op_leaves((args, kwargs))
            scalars = _scalars_of(leaves)
            if scalars != st.op_scalars[k]:
                j = self._skip_build(k, name, scalars)
                k, action = (j, RUN) if j >= 0 else (k, action)
            if self._build is not None:
                self._follow(k, name, scalars)
            if scalars != st.op_scalars[k]:
                raise self.diverge(
                    f"offrecomp: replay of region {self.region_name!r} diverged at op {k} ({name}): "
                    f"non-tensor arguments {scalars} differ from the recorded forward's "
                    f"{st.op_scalars[k]}"
                )
        if action == RUN:
            if "<generator>" in scalars and not all(
                self._known(x) for x in leaves if isinstance(x, torch.Generator)
            ):
                raise self.diverge(
                    f"offrecomp: replay of region {self.region_name!r} diverged at op {k} ({name}): "
                    "it draws from a generator that is neither an argument of the call nor an "
                    "attribute of its modules, whose state at the forward is not known"
                )
            if not st.view_ops[k]:
                self.ran += 1
                if self._placeholders and not _traits(func).metadata_only:  # NOTE [Placeholder guard]
                    for x in leaves:
                        if isinstance(x, torch.Tensor) and self.is_placeholder(x):
                            raise self.diverge(
                                f"offrecomp: replay of region {self.region_name!r} diverged at "
                                f"op {k} ({name}): it reads a tensor the recording did not need",
                                placeholder=True,
                            )
            return func(*args, **kwargs)
        outs = st.outputs[k]
        assert outs is not None
        rebuilt: list[Any] = []
        for o in outs:
            if isinstance(o, _Value):
                rebuilt.append(o.value)
            elif action == SERVE and o.storage >= 0:
                base, byte_offset = self.storage_tensors[o.storage]
                t = torch.empty(0, dtype=o.dtype, device=base.device)
                t.set_(base, o.offset + byte_offset // t.element_size(), o.size, o.stride)
                rebuilt.append(t)
            else:
                t = torch.empty_strided(o.size, o.stride, dtype=o.dtype, device=o.device)
                if t.numel():
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                    self._placeholders.add(ptr)
                    weakref.finalize(storage, self._placeholders.discard, ptr)
                rebuilt.append(t)
        if action == SERVE:
            self.served += 1
        else:
            self.stubbed += 1
        return _unflatten_like(func, rebuilt)
