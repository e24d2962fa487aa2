"""A replay serves ops whose outputs its region offloaded from the region's reload (NOTE
[Serving from reloads] in offrecomp/regenerate.py), on the emulated offload backend."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import offrecomp
from offrecomp import Placement, Plan, regenerate
from offrecomp.backends import EmulatedBackend
from offrecomp.groups import OffloadGroups
from offrecomp.transfer import Group, GroupState
from tests.helpers import assert_bitwise, train, twin
from tests.offrecomp.test_replay import (  # noqa: F401 - _always_serve: an autouse fixture
    _always_serve,
    _backward_flops,
    _gpt,
    _storage_of,
)


def _gelu_dropped_rest_offloaded(rt: offrecomp.Runtime) -> Plan:
    gelu = _storage_of(rt, "blocks.1", "gelu")
    assert len(gelu) == 1
    return Plan(
        placements={(f"blocks.{b}", 0, gelu[0]): Placement.RECOMPUTE for b in range(3)},
        default=Placement.OFFLOAD,
        plan_id="gelu-offload",
    )


def test_a_dropped_gelu_among_offloaded_storages_reruns_the_gelu_only() -> None:
    """GELU's output dropped, every other storage offloaded: the replay serves the first
    MLP matmul (its output offloaded) from the reload and runs GELU alone, so backward
    computes no matmul more than plain; without serving from the reload it reruns that
    matmul in every block."""
    model, idx = _gpt()
    plain = _backward_flops(twin(model), idx)
    m = twin(model)
    with offrecomp.runtime(m, mode="auto", min_bytes=0, d2h_gbps=5, h2d_gbps=5) as rt:
        _backward_flops(m, idx)  # measuring pass
        rt.set_plan(_gelu_dropped_rest_offloaded(rt))
        partial = _backward_flops(m, idx)
    last = rt.report().steps[-1]
    assert last.offloaded_bytes > 0 and last.replays == 3
    assert last.rerun_ops == 3  # one GELU per block
    assert partial == plain


@pytest.mark.parametrize("copy_delay_s", [0.0, 0.02])
def test_the_gradients_of_serving_from_reloads_are_bitwise(
    copy_delay_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With slow copies some groups are still reloading (issued, not waited on) when a
    replay fetches them; gradients stay bitwise. That the replay waits at all is the
    fetch count below and the engine's compute_after_h2d edge (test_offload_engine)."""
    init = EmulatedBackend.__init__
    monkeypatch.setattr(EmulatedBackend, "__init__", lambda self: init(self, copy_delay_s=copy_delay_s))
    model, idx = _gpt()

    def batch(step: int) -> torch.Tensor:
        return idx

    r = twin(model)
    ref = train(r, batch, steps=1) + train(r, batch, steps=3)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, d2h_gbps=5, h2d_gbps=5)
    got = train(m, batch, rt, steps=1)  # the measuring pass
    with rt:
        rt.set_plan(_gelu_dropped_rest_offloaded(rt))
    got += train(m, batch, rt, steps=3)
    assert_bitwise(ref, got)
    steps = [s for s in rt.report().steps if s.phase == "user-plan"]
    assert len(steps) == 3 and all(s.offloaded_bytes > 0 and s.rerun_ops == 3 for s in steps)


@pytest.mark.parametrize(
    ("state", "fetches", "due"),
    [
        (GroupState.RELOADING, 0, True),
        (GroupState.FETCHED, 1, True),
        (GroupState.OFFLOADED, 0, True),  # this backward has not reached it yet
        (GroupState.SERVED, 1, True),  # its held sources handed out (NOTE [Served groups])
        (GroupState.OFFLOADED, 1, False),  # released after its unpacks: not reloaded again
        (GroupState.FREED, 0, False),
        (GroupState.OPEN, 0, False),
    ],
)
def test_a_replay_serves_from_a_group_this_backward_reloads_anyway(
    state: GroupState, fetches: int, due: bool
) -> None:
    group = Group.__new__(Group)
    group.state = state
    group.fetches = fetches
    assert regenerate._reload_due(group) is due


class _Groups:
    """The runtime's offload groups as ``_servable_storages`` reads them (``slot_now``,
    the runtime's, through this ``fetch``), with a reloaded buffer."""

    fetch_or_serve = OffloadGroups.fetch_or_serve
    slot_now = OffloadGroups.slot_now

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf
        self.fetched = 0

    def fetch(self, group: Group, call: object, serve: bool = False) -> torch.Tensor:
        self.fetched += 1
        return self.buf


def _offloaded(slot: int, group: Group) -> SimpleNamespace:
    return SimpleNamespace(index=slot, placement=Placement.OFFLOAD, group=group, slot=slot)


@pytest.mark.parametrize(("versions", "served"), [([3, 5], [0, 1]), ([3, 6], [0]), ([], [])])
def test_a_slot_written_while_its_copy_was_in_flight_is_not_served_from(
    versions: list[int], served: list[int]
) -> None:
    """Slot 1's source was written after its copy was issued (version 5 at issue, 6 when
    the engine let go of it): the copy may hold either value, so replay runs the op that
    made it. Without versions seen since issue nothing is served. Each offloaded storage
    goes through ``OffloadGroups.fetch``, which makes compute wait on the reload."""
    group = Group.__new__(Group)
    group.state, group.fetches, group.served = GroupState.FETCHED, 1, None
    group.issue_versions, group.versions, group.offsets = [3, 5], versions, [0, 64]
    buf = torch.zeros(128, dtype=torch.uint8)
    groups = _Groups(buf)
    call = SimpleNamespace(storages=[_offloaded(0, group), _offloaded(1, group)])
    out = regenerate._servable_storages(call, groups)  # type: ignore[arg-type]
    assert groups.fetched == 2
    assert sorted(out) == served
    for i in served:
        storage, offset = out[i]
        assert storage.data_ptr() == buf.untyped_storage().data_ptr() and offset == 64 * i
    assert regenerate._servable_storages(call, None) == {}  # outside a backward: kept only
