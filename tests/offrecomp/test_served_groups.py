"""Groups whose sources are still held when backward reaches them are served, not
reloaded (NOTE [Served groups] in offrecomp/transfer.py), on the emulated backend."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

import offrecomp
from offrecomp import Placement, regenerate
from offrecomp.backends import EmulatedBackend
from offrecomp.config import Prefetch
from offrecomp.groups import OffloadGroups
from offrecomp.offload import OffloadEngine
from offrecomp.transfer import Group, GroupState
from tests.helpers import assert_bitwise, make, train, twin
from tests.offrecomp.test_layout_zoo import _FORBIDDEN, written_after_save
from tests.offrecomp.test_offload_engine import (
    SLOW,
    KiB,
    SpyBackend,
    emu,
    expect_race,
    make_engine,
    offload,
    random_bytes,
    slot,
)

pytestmark = pytest.mark.serve_held


@pytest.fixture()
def engine() -> Iterator[OffloadEngine]:
    eng = make_engine(prefetch=Prefetch(regions=1))
    yield eng
    eng.close()


def scenario_served_release(eng: OffloadEngine) -> None:
    """A group whose slow copy has not landed is served from its sources; once its
    saves are read, the engine lets go of them, compute first waiting on the copy."""
    data = random_bytes(64 * KiB, seed=11)
    emu(eng).copy_delay_s = SLOW
    src = data.clone()
    group = offload(eng, [src])
    del src
    assert eng.fetch(group, serve=True) is None
    assert group.state is GroupState.SERVED and group.served is not None
    assert torch.equal(group.served[0], data)
    eng.release_device(group)
    assert group.served is None and eng.stash_bytes == 0 and eng.device_bytes == 0
    emu(eng).copy_delay_s = 0.0
    assert torch.equal(slot(eng.fetch(group), group, 0).clone(), data)  # the host copy holds the data


def test_a_held_group_is_served_with_no_reload(engine: OffloadEngine) -> None:
    scenario_served_release(engine)
    stats = engine.end_step()
    assert (stats.groups_served, stats.groups_reloaded) == (1, 1)  # the reload: the read after release


def test_edge_compute_waits_on_d2h_before_a_served_group_goes() -> None:
    expect_race(scenario_served_release, "compute_after_d2h", match="freed before its copy ran")


def test_serving_is_off_where_the_engine_says_so(engine: OffloadEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OffloadEngine, "serve_held", False)
    emu(engine).copy_delay_s = SLOW / 5
    group = offload(engine, [random_bytes(4 * KiB, seed=1)])
    assert engine.fetch(group, serve=True) is not None and group.state is GroupState.FETCHED


def test_a_landed_group_is_reloaded(engine: OffloadEngine) -> None:
    data = random_bytes(8 * KiB, seed=2)
    group = offload(engine, [data.clone()])
    engine.synchronize()  # landed: its sources went
    assert torch.equal(slot(engine.fetch(group, serve=True), group, 0).clone(), data)
    assert engine.end_step().groups_served == 0


def test_a_prefetch_pins_a_held_group_instead_of_reloading_it(engine: OffloadEngine) -> None:
    """Prefetch(regions=1): serving the later group pins the earlier one's held sources
    (no reload, no bytes outstanding); reading it counts its fetch once."""
    emu(engine).copy_delay_s = SLOW / 5
    first = offload(engine, [random_bytes(8 * KiB, seed=3)], ordinal=0)
    second = offload(engine, [random_bytes(8 * KiB, seed=4)], ordinal=1)
    assert engine.fetch(second, serve=True) is None
    assert first.state is GroupState.SERVED and first.fetches == 0
    assert engine.outstanding_reload_bytes == 0
    assert engine.fetch(first, serve=True) is None and first.fetches == 1
    assert engine.fetch(first, serve=True) is None and first.fetches == 1
    stats = engine.end_step()
    assert (stats.groups_served, stats.groups_reloaded, stats.prefetches) == (2, 0, 0)
    emu(engine).copy_delay_s = 0.0


@contextlib.contextmanager
def slow_copies(backend: SpyBackend) -> Iterator[OffloadEngine]:
    """An engine on ``backend`` whose copies run late, closed after."""
    eng = make_engine(backend=backend)
    backend.copy_delay_s = SLOW / 5
    try:
        yield eng
    finally:
        backend.copy_delay_s = 0.0
        eng.close()


def test_a_free_lets_go_of_a_served_group_at_once_compute_after_its_copy() -> None:
    """NOTE [Freed sources] (offload.py): a freed group's served sources go at its free,
    compute ordered after their copy (a GPU-side wait on CUDA), not at the next poll."""
    backend = SpyBackend()
    with slow_copies(backend) as eng:
        group = offload(eng, [random_bytes(8 * KiB, seed=5)])
        assert eng.fetch(group, serve=True) is None
        since = len(backend.log)
        eng.free(group)
        waits = [e for op, s, e in backend.log[since:] if op == "wait" and s.is_compute]
        assert waits and waits[0] is group.d2h_done
        assert group.served is None and eng.stash_bytes == 0 and eng.device_bytes == 0


def test_a_backend_that_frees_after_a_stream_frees_a_group_without_a_wait() -> None:
    """NOTE [Freed sources]: where the backend can have the sources' memory reused after
    the D2H stream (CUDA's ``record_stream``), a free hands them to it: no wait on any
    stream, as compute waiting on a dead graph's copies would stall the next forward."""
    handed: list[tuple[list[torch.Tensor], object]] = []

    class FreesAfter(SpyBackend):
        def free_after(self, sources: list[torch.Tensor], stream: object) -> bool:
            handed.append((list(sources), stream))
            return True

    backend = FreesAfter()
    with slow_copies(backend) as eng:
        served = offload(eng, [random_bytes(8 * KiB, seed=7)], ordinal=0)
        held = offload(eng, [random_bytes(8 * KiB, seed=8)], ordinal=1)
        assert eng.fetch(served, serve=True) is None
        since = len(backend.log)
        eng.free(held)
        eng.free(served)
        assert not [op for op, *_ in backend.log[since:] if op == "wait"]
        d2h = eng.copy_streams(torch.device("cpu"))[0]
        assert [len(srcs) for srcs, _ in handed] == [1, 1] and all(s is d2h for _, s in handed)
        assert eng.stash_bytes == 0 and eng.device_bytes == 0


def test_a_free_on_a_copy_worker_leaves_a_served_group_to_its_copy() -> None:
    """NOTE [Frees on a copy worker]: a free there never waits: the served sources stay
    held for their copy, which lets go of them when it lands."""
    backend = SpyBackend()
    with slow_copies(backend) as eng:
        group = offload(eng, [random_bytes(8 * KiB, seed=6)])
        assert eng.fetch(group, serve=True) is None
        since = len(backend.log)
        backend.on_side_thread = lambda: True  # type: ignore[method-assign]
        eng.free(group)
        del backend.on_side_thread
        assert not [op for op, s, _ in backend.log[since:] if op == "wait" and s.is_compute]
        assert group.served is None and eng.stash_bytes == 8 * KiB
        backend.copy_delay_s = 0.0
        eng.synchronize()
        assert eng.stash_bytes == 0 and eng.device_bytes == 0


def test_a_buffer_read_of_a_served_group_reloads_it(engine: OffloadEngine) -> None:
    """A caller that needs the group as one buffer ends its serving and reloads it,
    ordered after its own copy; the fetch the serving counted is not counted again (its
    saves read since would count as new uses)."""
    data = random_bytes(16 * KiB, seed=6)
    emu(engine).copy_delay_s = SLOW / 5
    group = offload(engine, [data.clone()])
    assert engine.fetch(group, serve=True) is None and group.fetches == 1
    buf = engine.fetch(group)
    assert buf is not None and group.state is GroupState.FETCHED and group.served is None
    assert group.fetches == 1
    assert torch.equal(slot(buf, group, 0).clone(), data)
    emu(engine).copy_delay_s = 0.0


def _slow_copies(monkeypatch: pytest.MonkeyPatch, delay: float) -> None:
    init = EmulatedBackend.__init__
    monkeypatch.setattr(EmulatedBackend, "__init__", lambda self: init(self, copy_delay_s=delay))


@pytest.mark.parametrize("model_name", ["gpt_dropout", "kwargs_tuple"])
def test_forced_offload_with_a_slow_link_holds_no_more_than_keep(
    model_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies slower than the forward (5 ms each): every group is still held at its
    backward, and is served; the booked peak is keep's (within the order the two free
    storages in), where reloading held the sources and their reloads at once; gradients
    stay bitwise. ``kwargs_tuple``'s blocks each save the one mask the model made, which
    keep counts once (NOTE [Whole calls counted once] in shared.py) and each block's
    group once more while its copy is in flight."""
    _slow_copies(monkeypatch, 0.005)
    model, batch = make(model_name)
    ref = train(twin(model), batch, steps=3)
    peaks = {}
    for mode in ("keep", "offload"):
        m = twin(model)
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
        assert_bitwise(ref, train(m, batch, rt, steps=3))
        steps = rt.report().steps
        peaks[mode] = max(s.peak_activation_bytes for s in steps)
    shared = 2 * 4 * 6 * 48 * 4 if model_name == "kwargs_tuple" else 0  # the mask, in two more groups
    assert peaks["offload"] <= peaks["keep"] * 1.01 + shared, peaks  # reloading held 1.7-2x keep
    served = [s.served_groups for s in steps]
    assert served and all(n > 0 for n in served), served


@pytest.mark.parametrize("model_name", ["gpt_dropout", "views_inplace"])
def test_served_and_reloaded_groups_give_plain_gradients(model_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies that land during the forward for some groups and not for others (2 ms
    each): a step serves some groups and reloads the rest, bitwise."""
    _slow_copies(monkeypatch, 0.002)
    model, batch = make(model_name)
    ref = train(twin(model), batch, steps=4)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    assert_bitwise(ref, train(m, batch, rt, steps=4))
    assert any(s.served_groups and s.h2d_bytes for s in rt.report().steps), [
        (s.served_groups, s.h2d_bytes) for s in rt.report().steps
    ]


@pytest.mark.parametrize("synchronize", [False, True], ids=["held", "landed"])
def test_a_write_to_a_served_save_raises_like_plain(synchronize: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's output, saved by its tanh, written in place between forward and backward
    with its Python object gone: plain raises. A served group hands out the written
    source, and sees the write (``held``); once the copy landed the engine let go of the
    sources and the copy holds the saved value (``landed``: the limit of NOTE [Writes
    after a save] in handles.py, no error)."""
    _slow_copies(monkeypatch, 0.005)
    m, step = written_after_save(synchronize)
    with offrecomp.runtime(m, mode="offload", min_bytes=0) as rt:
        if synchronize:
            step(m, rt)  # the known limit: backward reads the value saved
        else:
            with pytest.raises(RuntimeError, match=_FORBIDDEN):
                step(m, rt)


class _ServedGroups:
    """The runtime's offload groups as a replay reads them (``slot_now``, the runtime's),
    with every group served."""

    fetch_or_serve = OffloadGroups.fetch_or_serve
    slot_now = OffloadGroups.slot_now

    def fetch(self, group: Group, call: object, serve: bool = False) -> torch.Tensor | None:
        assert serve
        return None


def test_a_replay_serves_from_a_served_groups_sources_unless_written_since_issue() -> None:
    """A replay in backward serves an op's output from its call's offloaded storage
    (NOTE [Serving from reloads] in offrecomp/regenerate.py); of a served group, from the
    held source itself, unless that source was written since its copy was issued."""
    sources = [torch.arange(16.0), torch.arange(8.0)]
    group = Group.__new__(Group)
    group.state, group.fetches, group.served, group.waited = GroupState.SERVED, 1, sources, False
    group.issue_versions = [s._version for s in sources]
    sources[1].add_(1.0)  # written since issue: the copy may hold either value
    call = SimpleNamespace(storages=[
        SimpleNamespace(index=i, placement=Placement.OFFLOAD, group=group, slot=i) for i in range(2)
    ])
    out = regenerate._servable_storages(call, _ServedGroups())  # type: ignore[arg-type]
    assert sorted(out) == [0]
    storage, offset = out[0]
    assert storage.data_ptr() == sources[0].untyped_storage().data_ptr() and offset == 0


def test_close_lets_go_of_served_sources() -> None:
    """A closed engine holds no device sources, served ones included; a later read of
    the group fails as any read after close does."""
    eng = make_engine()
    emu(eng).copy_delay_s = SLOW / 5
    group = offload(eng, [random_bytes(8 * KiB, seed=7)])
    assert eng.fetch(group, serve=True) is None and group.served is not None
    emu(eng).copy_delay_s = 0.0
    eng.close()
    assert group.served is None and group.in_flight is None
    with pytest.raises(RuntimeError, match="closed"):
        eng.fetch(group, serve=True)
