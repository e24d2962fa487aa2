"""Flattening a profile: the flat layout, and errors that name the bad value.

``flatten`` checks each attribute as an array over the whole profile; these tests pin
that a bad value anywhere is still reported by name, as the per-item checks did.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler import ROOT, OpRecord, Profile, RegionRecord, StorageRecord
from scheduler.simulate import flatten


def block(name: str, start: float) -> RegionRecord:
    """op0 (1 s) makes s0 (100 B); op1 (2 s) reads op0 and makes s1 (200 B)."""
    return RegionRecord(
        name=name,
        call_index=0,
        start_seconds=start,
        forward_seconds=3.0,
        backward_seconds=6.0,
        ops=[
            OpRecord(seconds=1.0, skippable=True, outputs=(0,), reads=()),
            OpRecord(seconds=2.0, skippable=True, outputs=(1,), reads=(0,)),
        ],
        storages=[
            StorageRecord(
                nbytes=100, producer_op=0, first_save_op=1, last_save_op=1, offset_seconds=1.0
            ),
            StorageRecord(
                nbytes=200, producer_op=1, first_save_op=2, last_save_op=2, offset_seconds=3.0
            ),
        ],
    )


def profile_with_roots(*root_offsets: float) -> Profile:
    """Two back-to-back regions (0-3 s, 3-6 s); root storage ``i`` has ``i + 1`` bytes."""
    return Profile(
        signature="flat",
        forward_seconds=6.0,
        backward_seconds=12.0,
        d2h_gbps=1.0,
        h2d_gbps=1.0,
        regions=[block("l0", 0.0), block("l1", 3.0)],
        root=[StorageRecord(nbytes=i + 1, offset_seconds=t) for i, t in enumerate(root_offsets)],
    )


def test_root_storages_go_to_the_last_gap_started_by_their_save() -> None:
    # gaps start at 0 s, 3 s and 6 s (the end of forward); a save after it is clamped
    flat = flatten(profile_with_roots(4.0, 0.5, 100.0, 3.0))
    assert flat.keys == [
        (ROOT, 0, 1),
        ("l0", 0, 0),
        ("l0", 0, 1),
        (ROOT, 0, 0),
        (ROOT, 0, 3),
        ("l1", 0, 0),
        ("l1", 0, 1),
        (ROOT, 0, 2),
    ]
    assert flat.st_ptr.tolist() == [0, 1, 3, 5, 7, 8]
    assert flat.unit_of.tolist() == [0, 1, 1, 2, 2, 3, 3, 4]
    assert flat.nbytes.tolist() == [2, 100, 200, 1, 4, 100, 200, 3]
    assert flat.save_time.tolist() == [0.5, 1.0, 3.0, 4.0, 3.0, 4.0, 6.0, 6.0]
    # producers as global op indices: l1's ops are 2 and 3
    assert flat.st_prod.tolist() == [-1, 0, 1, -1, -1, 2, 3, -1]
    assert flat.save_order.tolist() == [0, 1, 2, 4, 3, 5, 6, 7]
    assert flat.key_index == {k: i for i, k in enumerate(flat.keys)}
    assert flat.dataflow.tolist() == [False, True, False, True, False]


def test_opaque_regions_and_unknown_reads_replay_by_prefix() -> None:
    p = profile_with_roots()
    p.regions[0].opaque = True
    p.regions[1].ops[1].reads = None
    flat = flatten(p)
    assert flat.dataflow.tolist() == [False, False, False, False, False]
    assert flat.rd_ptr.tolist() == [0, 0, 0, 0, 0]
    # an opaque region never serves an op
    assert flat.op_serv.tolist() == [False, False, True, True]


def _set(path: str, value: object) -> Callable[[Profile], None]:
    """Set ``value`` at ``path`` (``regions.1.storages.0.nbytes``) of a profile."""

    def apply(p: Profile) -> None:
        *parts, attr = path.split(".")
        obj: object = p
        for part in parts:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)  # type: ignore[index]
        setattr(obj, attr, value)

    return apply


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("regions.1.forward_seconds", float("nan"), "region l1#0 forward_seconds = nan is invalid"),
        ("regions.0.backward_seconds", -1.0, "region l0#0 backward_seconds = -1.0 is invalid"),
        ("root.1.offset_seconds", -2.0, "root storage 1 offset_seconds = -2.0 is invalid"),
        ("root.0.nbytes", "x", "root storage 0 nbytes = 'x' is invalid; accepted: an int from 0 to 2**53 - 1"),
        ("regions.1.storages.1.nbytes", 2.5, "storage 1 of region l1#0 nbytes = 2.5 is invalid"),
        (
            "regions.1.storages.0.last_save_op",
            -1,
            "storage 0 of region l1#0 last_save_op = -1 is invalid; accepted: an int from 0 to 2**63 - 1",
        ),
        ("regions.1.storages.0.last_save_op", 2**63, "storage 0 of region l1#0 last_save_op = 9223372036854775808"),
        ("regions.1.storages.1.first_save_op", 10**30, "storage 1 of region l1#0 first_save_op = 10000"),
        ("root.0.saves", 2**64, "root storage 0 saves = 18446744073709551616 is invalid; accepted: an int from 0"),
        (
            "regions.0.storages.1.offset_seconds",
            float("inf"),
            "storage 1 of region l0#0 offset_seconds = inf is invalid; accepted: a finite number",
        ),
        (
            "regions.1.storages.0.producer_op",
            5,
            "storage 0 of region l1#0 producer_op = 5 is invalid; accepted: -1 or an op index "
            "in 0..1",
        ),
        (
            "regions.1.storages.1.kind",
            "weights",
            "storage 1 of region l1#0 kind = 'weights' is invalid; accepted: activation, input, "
            "external",
        ),
        ("regions.1.ops.1.seconds", -2.0, "op 1 of region l1#0 seconds = -2.0 is invalid"),
        ("regions.1.ops.0.outputs", (0, 2), "op 0 of region l1#0 has output 2; accepted: -1 or"),
        ("regions.0.ops.1.reads", (5,), "op 1 of region l0#0 reads op 5; accepted: an op index"),
        ("regions.1.name", "l0", "region l0#0 appears twice"),
        ("regions.1.name", ROOT, "region name '' is reserved for root storages"),
    ],
)
def test_a_bad_value_is_named(path: str, value: object, message: str) -> None:
    p = profile_with_roots(0.0, 1.0)
    _set(path, value)(p)
    with pytest.raises(ValueError) as err:
        flatten(p)
    assert message in str(err.value)


def _sized(*sizes: int) -> Profile:
    return Profile(signature="s", forward_seconds=float(len(sizes)), regions=[
        RegionRecord(
            name=f"l{i}", call_index=0, start_seconds=float(i), forward_seconds=1.0, backward_seconds=2.0,
            storages=[StorageRecord(nbytes=n, offset_seconds=1.0)],
        )
        for i, n in enumerate(sizes)
    ])


@pytest.mark.parametrize("nbytes", [2**53, 2**63, 2**64])
def test_a_storage_too_large_for_exact_sums_is_named(nbytes: int) -> None:
    """The simulator sums bytes in int64: a storage of 2**53 bytes or more (numpy would
    wrap 2**63 to a negative count, and hold 2**64 as an object) is refused by name."""
    with pytest.raises(ValueError, match=r"storage 0 of region l0#0 nbytes = \d+ is invalid; accepted: an int from 0 to 2\*\*53 - 1"):
        flatten(_sized(nbytes))


def test_storages_too_large_together_are_refused() -> None:
    """Each storage in range, their total at 2**62 or more: refused (the peak of a plan
    keeping them would wrap)."""
    flatten(_sized(*[2**52] * 1023))
    with pytest.raises(ValueError, match=r"storages hold .* bytes in all; accepted: under 2\*\*62"):
        flatten(_sized(*[2**52] * 1024))
