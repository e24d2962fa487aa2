"""Pass signatures: what the inputs of a root forward (or of a pass's first region call)
say about the saves of a pass, and the signature of a pass whose root forwards are
several.

NOTE [Pass signatures]
A pass's signature is the signatures of its root forwards, in order, joined by " + "
(its family and sizes likewise); a pass with one forward has that forward's. A siamese
or query/document loop (``q = model(a); d = model(b); (q + d).backward()``) runs the
calls of both forwards in one pass, numbered on from the first's, so each combination
of shapes saves other storages: each is a signature of its own, with its own profile
and plan.

Placements are decided while a forward runs, before a later forward shows its
inputs, so the first forward chooses the combination the pass is planned for
(``Combinations.choose``): of the combinations that the last WINDOW passes beginning
with the same forward had, the largest (by the product of each forward's input sizes,
summed over its forwards: a forward of one input counts its elements, which is what its
saves grow with; a sum of sizes would rank 2 x 24 tokens over 8 x 16; the most recent
among equals); for a first forward not seen before, those of passes whose first forward
was of its family, with its own sizes first (NOTE [Borrowed plans] then finds a plan
that covers them); else the forward alone. A combination seen once among those passes
that MAX_DEPARTURES passes in a row departed from, none running it, is left out until it
runs again: such a one-off (a loss kept and never differentiated joins the next step's
forwards) would otherwise be chosen by every pass beginning like it for WINDOW passes,
each departing from a choice that never calibrates (a full recompute). A combination
seen twice or more stays chosen however many passes depart from it between its runs
(the inner passes of a meta-learning step, then its outer pass of two forwards). Each
later root forward, and the start of the backward, checks the choice; a pass whose
forwards depart from it takes the signature of what ran and goes on by the phase it
began in (``Planner.resign``):

- planned: it borrows the plan it began with (NOTE [Borrowed plans]): each later
  storage is checked against the size that plan placed, a larger one drops the rest of
  its call, and a call the plan lacks drops everything (the measuring pass's rule).
  Where the chosen combination covers what ran (the same family, no size larger) that
  plan's peak bounds the pass's: the reason the choice is the largest seen. A pass
  larger than every combination seen may go over the budget, once: the next pass that
  begins like it chooses it, and measures it.
- measuring: it goes on measuring for the signature of what ran when that one has no
  profile yet (its recordings hold every call), else stops recording;
- calibrating: a plain full recompute; the chosen signature calibrates at its next pass.

Such a pass teaches no cost model (one that goes on measuring profiles what ran), and a
plan entry made for the choice alone is dropped.
Forwards whose sizes cannot be ordered (one larger in one forward, smaller in another)
have no covering choice: a pass that departs from the one chosen may go over the budget
whenever it does. A root forward called inside another (a model calling itself) is part
of the outer forward and adds nothing. A pass that begins at a region call, with no root
forward (a loop calling ``model.compute_loss(batch)``, which calls the blocks itself),
takes the signature of that call's inputs, named by its region
("train|blocks.0:(2, 16, 32):float32:cpu"); each later call of that region outside
every root forward (``compute_loss`` called twice in a pass) is one more part. In a pass
named by its root forward, the first region called outside every root forward (a
``compute_loss`` after ``model(q)``) names a part, and so do its later calls there.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offrecomp import _torch_compat as tc

if TYPE_CHECKING:
    from offrecomp.placement import Placements
    from offrecomp.planning import Planner
    from offrecomp.state import PassState

__all__ = ["Combinations", "Frozen", "Part", "PassSignatures", "combine", "shown", "signature_of"]

Part = tuple[str, str, tuple[int, ...]]
"""One root forward's signature, family (the signature without sizes) and sizes."""

#: Passes remembered per first forward (and per first forward's family) for the choice.
WINDOW = 16
#: First forwards (and families) remembered.
FIRSTS = 1024
#: Root forwards a message shows of a joined signature; it counts the rest.
SHOWN_PARTS = 3
#: Signatures remembered for ``PassState.new_signature`` (NOTE [Module attributes]).
SIGNATURES_SEEN = 1024
#: Passes in a row that departed from a combination, none running it, after which passes
#: beginning like them choose it no more until it runs again.
MAX_DEPARTURES = 4


class Frozen:
    """Which parameters of a module do not train, as a signature reads it (NOTE [Frozen
    parameters]): each module's parameter list is read again only when the structure
    epoch moved or the runtime was entered again (``clear``)."""

    def __init__(self) -> None:
        self._params: dict[int, tuple[int, Any, list[tuple[dict[str, Any] | None, str, torch.Tensor]]]] = {}

    def clear(self) -> None:
        self._params.clear()

    def of(self, module: Any, epoch: int) -> str:
        """'' when every parameter of ``module`` requires grad, else which do not, and which
        slots hold another tensor than a parameter (``torch.func.functional_call``'s)."""
        hit = self._params.get(id(module))
        if hit is None or hit[0] != epoch or hit[1] is not module:
            slots = [
                # a dict's slots are read again below (a TorchScript module's table is none)
                (d if isinstance(d, dict) else None, k, p)
                for m in module.modules() for d in (m._parameters,) for k, p in d.items() if p is not None
            ]
            hit = self._params[id(module)] = (epoch, module, slots)
        flags = bytes(
            p.requires_grad if d is None or (t := d.get(k)) is p
            else t.requires_grad if isinstance(t, nn.Parameter) else _SUBSTITUTED  # another parameter there
            for d, k, p in hit[2]
        )
        if all(f == 1 for f in flags):
            return ""
        substituted = flags.count(_SUBSTITUTED)
        return (
            f"frozen:{flags.count(0)}/{len(flags)}"
            + (f",substituted:{substituted}" if substituted else "")
            + f":{zlib.crc32(flags):08x}"
        )


_SUBSTITUTED = 2  # a parameter slot holding a plain tensor (a fast weight) or nothing


# NOTE [Frozen parameters]
# Which parameters train decides what a pass saves: a frozen block whose input needs no
# gradient saves nothing, and one whose input does saves only what the input's gradient
# needs. A model unfrozen between steps (progressive unfreezing, an adapter's base
# frozen) saves other storages at the same input shapes, so a plan or a native keep's
# books of the frozen passes would not describe it (one step at twice the budget, or a
# keep run reporting a sixteenth of its bytes). A signature whose module has frozen
# parameters names them (how many, and a digest of which), so each freezing state is a
# signature of its own. So does one whose parameter slots hold other tensors than
# parameters (``torch.func.functional_call`` with fast weights, as MAML's outer step
# runs): those are activations, saved and placed, where the parameters are not. The
# flags cost about 100 ns per parameter per root forward.


def signature_of(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    training: bool,
    name: str = "",
    dtype: torch.dtype | None = None,
    frozen: str = "",
) -> Part:
    """A forward's signature, its family (the signature without sizes) and its sizes;
    ``name``: what the pass began in when it is not the model's own forward (the model of
    a container root, NOTE [Container roots]; the region of a pass without a root forward,
    NOTE [Pass signatures]); ``dtype``: its parameters' (a model cast between steps saves
    other bytes). Autocast, on for the inputs' devices, is part of it too: it changes
    every save."""
    leaves, _ = tc.tree_flatten((args, kwargs))
    parts, kinds = [], []
    dims: list[int] = []
    devices: set[str] = set()
    for x in leaves:
        if isinstance(x, torch.Tensor):
            devices.add(x.device.type)
            if x.is_nested and x.layout == torch.jagged:
                # the ragged dimension is a symbol new to every nested tensor built: the
                # components and the packed values decide the memory instead
                sizes = (int(x.size(0)), *x.values().shape)
                shape = f"{x.size(0)}x{tuple(x.values().shape)}"
            else:
                sizes = tuple(x.shape)
                shape = str(sizes)
                if x.layout is torch.strided and not x.is_contiguous():
                    shape += f"s{tuple(x.stride())}"  # NOTE [Stale recordings] in regenerate.py
            kind = f"{str(x.dtype).replace('torch.', '')}:{x.device.type}"
            parts.append(f"{shape}:{kind}")
            kinds.append(f"{'n' if x.is_nested else ''}{len(sizes)}:{kind}")
            dims += [int(d) for d in sizes]
    mode = ("train|" if training else "eval|") + (f"{name}:" if name else "")
    if dtype is not None and dtype != torch.float32:
        mode += f"params:{str(dtype).replace('torch.', '')}|"
    if frozen:
        mode += frozen + "|"  # NOTE [Frozen parameters]
    for d in sorted(devices):
        if d in ("cpu", "cuda") and torch.is_autocast_enabled(d):
            mode += f"autocast:{d}:{str(torch.get_autocast_dtype(d)).replace('torch.', '')}|"
    return mode + ",".join(parts), mode + ",".join(kinds), tuple(dims)


def combine(parts: Sequence[Part]) -> Part:
    """The signature, family and sizes of a pass whose root forwards had ``parts``
    (NOTE [Pass signatures]); one forward's own."""
    if len(parts) == 1:
        return parts[0]
    return (
        " + ".join(p[0] for p in parts),
        " + ".join(p[1] for p in parts),
        tuple(d for p in parts for d in p[2]),
    )


#: The signature of a pass no root forward of the managed model began: its region calls
#: ran outside it (another model's forward reaching them, as a copy of the model made
#: inside the runtime does: NOTE [Copies of a managed model] in slots.py).
UNNAMED = "unknown"


def shown(signature: str) -> str:
    """``signature`` as a message shows it: of a pass of many root forwards, the first
    ``SHOWN_PARTS`` and how many more; the unnamed one with what it is."""
    if signature == UNNAMED:
        return (
            f"{UNNAMED} (region calls outside any forward of the managed model: another model "
            "reaching its blocks, such as a copy of it made inside the runtime)"
        )
    parts = signature.split(" + ", SHOWN_PARTS + 1)
    if len(parts) <= SHOWN_PARTS + 1:
        return signature
    more = signature.count(" + ") + 1 - SHOWN_PARTS
    return " + ".join(parts[:SHOWN_PARTS]) + f" + ... {more} more"


class Combinations:
    """The root forwards of recent passes, by their first forward and by its family;
    the combination a new pass is planned for (NOTE [Pass signatures])."""

    def __init__(self) -> None:
        self._by_first: OrderedDict[str, deque[tuple[Part, ...]]] = OrderedDict()
        self._by_family: OrderedDict[str, deque[tuple[Part, ...]]] = OrderedDict()
        self._departures: dict[tuple[Part, ...], int] = {}

    def note(self, parts: tuple[Part, ...]) -> None:
        """A pass's backward began after root forwards ``parts``."""
        _remember(self._by_first, parts[0][0], parts)
        _remember(self._by_family, parts[0][1], parts)
        self._departures.pop(parts, None)

    def departed(self, chosen: tuple[Part, ...]) -> None:
        """A pass planned for ``chosen`` ran other root forwards."""
        if len(self._departures) >= FIRSTS:
            self._departures.clear()
        self._departures[chosen] = self._departures.get(chosen, 0) + 1

    def choose(self, first: Part) -> tuple[Part, ...]:
        """The root forwards a pass that begins with ``first`` is planned for."""
        seen = self._by_first.get(first[0])
        if seen:
            candidates = list(seen)
        else:
            kin = self._by_family.get(first[1])
            if not kin:
                return (first,)
            candidates = [(first, *c[1:]) for c in kin]
        gone = self._departures
        if gone:  # a one-off departed from often enough (NOTE [Pass signatures])
            candidates = [
                c for c in candidates if gone.get(c, 0) < MAX_DEPARTURES or candidates.count(c) > 1
            ] or [(first,)]
        return max(reversed(candidates), key=_size)  # the first maximum: the most recent


def _size(parts: tuple[Part, ...]) -> int:
    return sum(math.prod(p[2]) for p in parts)


def _remember(seen: OrderedDict[str, deque[tuple[Part, ...]]], key: str, parts: tuple[Part, ...]) -> None:
    passes = seen.get(key)
    if passes is None:
        passes = seen[key] = deque(maxlen=WINDOW)
        if len(seen) > FIRSTS:
            seen.popitem(last=False)
    else:
        seen.move_to_end(key)
    passes.append(parts)


class PassSignatures:
    """The signature each pass is planned for and the one it ran (NOTE [Pass
    signatures]), told to the planner."""

    def __init__(self, planner: Planner, placements: Placements) -> None:
        self._planner = planner
        self._placements = placements
        self._combinations = Combinations()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def choose(self, p: PassState, part: Part, region: str) -> None:
        """``p``'s first root forward (or call of ``region``) had ``part``: the
        combination it is planned for."""
        p.parts = [part]
        p.named_by = region
        p.expected = self._combinations.choose(part)
        p.signature, p.family, p.dims = combine(p.expected)

    def adopt(self, p: PassState, part: Part, region: str) -> None:
        """``p`` began at a save before the model's forward, without a signature: it takes
        the forward's, and is planned for it."""
        guess = p.signature
        self.choose(p, part, region)
        p.recording = p.planned = False
        p.phase = p.plan_id = p.plan_signature = ""
        p.plan = None
        self.note(p)
        self._planner.left(p, guess)
        self._planner.begin_pass(p)
        root = p.root
        if root is not None:  # its saves so far were placed unplanned; the rest by the plan
            self._planner.assign(p, root)
            root.fixed = self._placements.fixed(root)

    def join(self, p: PassState, part: Part) -> None:
        """One more root forward of ``p``, with ``part``: does it run what ``p`` was
        planned for?"""
        p.parts.append(part)
        if tuple(p.parts) != p.expected[: len(p.parts)]:
            self._resign(p, final=False)

    def settle(self, p: PassState) -> None:
        """``p``'s forwards are over (its backward begins, or it ends): its signature is
        what ran."""
        if p.parts and tuple(p.parts) != p.expected:
            self._resign(p)

    def ran(self, p: PassState) -> None:
        """``p``'s backward began with its forwards settled: a combination seen."""
        self._combinations.note(p.expected)

    def note(self, p: PassState) -> None:
        """Is ``p``'s signature new (``PassState.new_signature``)? It is seen now."""
        seen = self._seen
        p.new_signature = p.signature not in seen
        seen[p.signature] = None
        seen.move_to_end(p.signature)
        if len(seen) > SIGNATURES_SEEN:
            seen.popitem(last=False)

    def _resign(self, p: PassState, *, final: bool = True) -> None:
        """``p`` takes the signature of what ran; one that more forwards may extend
        (``final=False``) is not remembered: only the last of them names a pass."""
        chosen = p.signature
        if not p.departed:  # once per pass, from what its first forward chose
            p.departed = True
            self._combinations.departed(p.expected)
        p.expected = tuple(p.parts)
        p.signature, p.family, p.dims = combine(p.expected)
        if final:
            self.note(p)
        else:
            p.new_signature = p.signature not in self._seen
        self._planner.resign(p, chosen)
