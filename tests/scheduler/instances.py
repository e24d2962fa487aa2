"""Random small profiles for property tests (built from a seed so failures replay)."""

from __future__ import annotations

import random
from typing import cast

from scheduler.profile import OpRecord, Profile, RegionRecord, StorageKind, StorageRecord


def random_profile(
    seed: int, *, max_regions: int = 3, max_storages: int = 3, root: bool = True
) -> Profile:
    """A valid profile with 1..max_regions regions of 1..max_storages storages each.

    Ops and storages are consistent with the profile contract: each activation has a
    producer op before its last save, offsets are the op times before the first save.
    """
    rng = random.Random(seed)
    regions = []
    t = 0.0
    link = rng.random() < 0.7
    for r in range(rng.randint(1, max_regions)):
        n_ops = rng.randint(0, 4) if rng.random() < 0.1 else rng.randint(1, 4)
        ops = [
            OpRecord(
                seconds=rng.choice([0.0, 0.5, 1.0, 2.0, 3.0])
                if rng.random() < 0.9
                else rng.uniform(0, 4),
                skippable=rng.random() < 0.75,
            )
            for _ in range(n_ops)
        ]
        storages = []
        outputs: list[list[int]] = [[] for _ in range(n_ops)]
        for i in range(rng.randint(1, max_storages)):
            kind = cast(
                StorageKind, rng.choices(["activation", "input", "external"], weights=[6, 2, 1])[0]
            )
            nbytes = (
                rng.choice([0, 1, 2, 3, 5, 8]) if rng.random() < 0.2 else rng.randint(1, 10) * 10
            )
            if kind == "activation" and n_ops:
                prod = rng.randrange(n_ops)
                outputs[prod].append(i)
                last = rng.randint(prod + 1, n_ops)
                first = rng.randint(prod + 1, last)
            else:
                prod = -1
                last = rng.randint(0, n_ops)
                first = rng.randint(0, last)
            storages.append(
                StorageRecord(
                    nbytes=nbytes,
                    kind=kind,
                    producer_op=prod,
                    first_save_op=first,
                    last_save_op=last,
                )
            )
        for j, op in enumerate(ops):
            outs = outputs[j]
            if rng.random() < 0.25:
                outs = [*outs, -1]
            op.outputs = tuple(outs)
        fwd = sum(o.seconds for o in ops) if ops else rng.choice([1.0, 2.0])
        for s in storages:
            s.offset_seconds = sum(o.seconds for o in ops[: s.first_save_op]) if ops else 0.0
        regions.append(
            RegionRecord(
                name=f"layers.{r}",
                call_index=0,
                start_seconds=t,
                forward_seconds=fwd,
                backward_seconds=rng.choice([0.0, 1.0, 2.0]) * max(fwd, 0.5)
                if rng.random() < 0.9
                else 0.0,
                ops=ops,
                storages=storages,
                opaque=rng.random() < 0.1,
            )
        )
        t += fwd
    roots = []
    if root and rng.random() < 0.4:
        roots.append(
            StorageRecord(
                nbytes=rng.randint(1, 5) * 10,
                kind="activation",
                offset_seconds=rng.choice([0.0, t]),
            )
        )
    return Profile(
        signature=f"random-{seed}",
        forward_seconds=t + rng.choice([0.0, 0.0, 1.0]),
        backward_seconds=0.0,
        d2h_gbps=rng.choice([5e-9, 20e-9, 100e-9]) if link else 0.0,
        h2d_gbps=rng.choice([5e-9, 20e-9, 100e-9]) if link else 0.0,
        regions=regions,
        root=roots,
    )


def random_dataflow_profile(
    seed: int, *, max_regions: int = 3, max_storages: int = 3, root: bool = True
) -> Profile:
    """``random_profile`` with dataflow: most regions get ``reads`` on every op (each op
    reads up to two earlier ops) and some sinks; the others keep ``reads=None`` (prefix
    replay). A few activations lose their producer (``producer_op=-1``: the dataflow
    replay falls back to the prefix rule)."""
    profile = random_profile(seed, max_regions=max_regions, max_storages=max_storages, root=root)
    rng = random.Random(seed * 7919 + 1)
    for r in profile.regions:
        if rng.random() < 0.15:
            continue
        for j, op in enumerate(r.ops):
            op.reads = tuple(sorted(rng.sample(range(j), rng.randint(0, min(j, 2)))))
            op.sink = rng.random() < 0.25
            op.view = not op.sink and not op.skippable and rng.random() < 0.3
        for s in r.storages:
            if s.kind == "activation" and rng.random() < 0.08:
                s.producer_op = -1
    return profile
