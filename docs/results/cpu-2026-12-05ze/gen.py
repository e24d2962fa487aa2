"""Random and adversarial profile generator for fuzzing scheduler/ (seeded).

gen_profile(seed, scale) builds a Profile that respects the contract in
scheduler/profile.py: activations have a producer op before their last save, outputs
name their storages, offsets are the op times before the first save (or a perturbed
version of them), reads point to earlier ops.
"""

from __future__ import annotations

import random

from scheduler.profile import OpRecord, Profile, RegionRecord, StorageRecord

GB = 10**9


def _nbytes(rng: random.Random, mode: str) -> int:
    if mode == "tiny":
        return rng.choice([0, 0, 1, 2, 3, 5, 8, 10, 20, 40, 70, 100])
    r = rng.random()
    if r < 0.08:
        return 0
    if r < 0.15:
        return rng.randint(1, 512)
    if r < 0.97:
        return int(10 ** rng.uniform(3, 9))
    return int(rng.uniform(1, 8) * GB)  # a few enormous ones


def _op_time(rng: random.Random, mode: str) -> float:
    r = rng.random()
    if r < 0.12:
        return 0.0
    if mode == "tiny":
        return rng.choice([0.5, 1.0, 2.0, 3.0]) if r < 0.8 else rng.uniform(0, 4)
    return 10 ** rng.uniform(-7, -1)


def gen_profile(
    seed: int,
    *,
    max_regions: int = 60,
    max_storages: int = 50,
    max_ops: int = 40,
    mode: str = "wide",
    total_storage_cap: int | None = None,
) -> Profile:
    rng = random.Random(seed)
    n_regions = rng.randint(0, max_regions) if rng.random() < 0.05 else rng.randint(1, max_regions)
    n_names = max(1, n_regions if rng.random() < 0.7 else rng.randint(1, max(1, n_regions)))
    calls: dict[str, int] = {}
    all_zero = rng.random() < 0.04
    consistent_starts = rng.random() < 0.8
    regions: list[RegionRecord] = []
    t = 0.0
    st_left = total_storage_cap if total_storage_cap is not None else 10**9
    for r in range(n_regions):
        name = f"blk.{r % n_names}"
        ci = calls.get(name, 0)
        calls[name] = ci + 1
        n_ops = 0 if rng.random() < 0.08 else rng.randint(1, max_ops)
        dataflow = rng.random() < 0.6
        ops = []
        for j in range(n_ops):
            sec = 0.0 if all_zero else _op_time(rng, mode)
            skippable = rng.random() < 0.75
            op = OpRecord(seconds=sec, skippable=skippable, name=f"op{j}")
            if dataflow:
                op.reads = tuple(sorted(rng.sample(range(j), rng.randint(0, min(j, 3)))))
                op.sink = rng.random() < 0.12
                op.view = (not op.sink) and (not skippable) and rng.random() < 0.3
            ops.append(op)
        if dataflow and ops and rng.random() < 0.1:
            ops[rng.randrange(len(ops))].reads = None  # partially unknown -> prefix rule
        n_st = min(st_left, rng.randint(0, max_storages) if rng.random() < 0.15 else rng.randint(1, max_storages))
        st_left -= n_st
        outputs: list[list[int]] = [[] for _ in range(n_ops)]
        storages = []
        for i in range(n_st):
            kind = rng.choices(["activation", "input", "external"], weights=[7, 2, 1])[0]
            nb = _nbytes(rng, mode)
            if kind == "activation" and n_ops and rng.random() > 0.05:
                prod = rng.randrange(n_ops)
                outputs[prod].append(i)
                last = rng.randint(prod + 1, n_ops)
                first = rng.randint(prod + 1, last)
            else:
                prod = -1
                last = rng.randint(0, n_ops)
                first = rng.randint(0, last)
            off = sum(o.seconds for o in ops[:first])
            if rng.random() < 0.05:
                off *= rng.uniform(0.5, 2.0)
            s = StorageRecord(
                nbytes=nb, kind=kind, producer_op=prod, first_save_op=first, last_save_op=last,
                offset_seconds=off, saves=rng.choice([1, 1, 1, 2, 3]) if kind != "input" else rng.choice([0, 1, 1, 2]),
            )
            storages.append(s)
        for j, op in enumerate(ops):
            outs = outputs[j]
            if rng.random() < 0.2:
                outs = [*outs, -1]
            op.outputs = tuple(outs)
        # a region input the block before saved (Inputs counted once)
        if regions and storages and storages[0].kind == "input" and regions[-1].storages and rng.random() < 0.3:
            prev = regions[-1]
            storages[0].shared_with = (prev.name, prev.call_index, len(prev.storages) - 1)
            storages[0].nbytes = prev.storages[-1].nbytes
        fwd = sum(o.seconds for o in ops) if ops else (0.0 if all_zero else rng.choice([1e-3, 1e-2, 0.0]))
        if mode == "tiny" and not ops and not all_zero:
            fwd = rng.choice([1.0, 2.0])
        bwd = 0.0 if all_zero else (rng.choice([0.0, 1.0, 2.0, 3.0]) * fwd if rng.random() < 0.9 else rng.uniform(0, 3) * fwd)
        reg = RegionRecord(
            name=name, call_index=ci, start_seconds=t if consistent_starts else rng.uniform(0, 1),
            forward_seconds=fwd, backward_seconds=bwd, ops=ops, storages=storages,
            opaque=rng.random() < 0.1, replayable=rng.random() > 0.15,
        )
        if rng.random() < 0.1:
            reg.host_seconds = fwd * rng.uniform(0, 2)
        if rng.random() < 0.1:
            reg.backward_host_seconds = bwd * rng.uniform(0, 2)
        regions.append(reg)
        gap = 0.0 if (all_zero or rng.random() < 0.6) else fwd * rng.uniform(0, 0.5)
        t += fwd + gap
    roots = []
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        roots.append(StorageRecord(nbytes=_nbytes(rng, mode), offset_seconds=rng.choice([0.0, t, rng.uniform(0, t + 1e-9), t * 2])))
    # region input shared with a root storage (a skip the root saved)
    if roots and regions and rng.random() < 0.2:
        r = rng.choice(regions)
        for s in r.storages:
            if s.kind == "input":
                s.shared_with = ("", 0, 0)
                s.nbytes = roots[0].nbytes
                break
    lk = rng.random()
    if lk < 0.3:
        d2h = h2d = 0.0
    elif lk < 0.38:
        d2h, h2d = (rng.uniform(1, 100), 0.0) if rng.random() < 0.5 else (0.0, rng.uniform(1, 100))
    else:
        if mode == "tiny":
            d2h = rng.choice([5e-9, 20e-9, 100e-9, 1e-6])
            h2d = rng.choice([5e-9, 20e-9, 100e-9, 1e-6])
        else:
            d2h = 10 ** rng.uniform(-3, 3)
            h2d = d2h if rng.random() < 0.6 else 10 ** rng.uniform(-3, 3)
    total = sum(s.nbytes for r in regions for s in r.storages) + sum(s.nbytes for s in roots)
    host_limit = 0
    if d2h > 0 and h2d > 0 and rng.random() < 0.3:
        host_limit = int(total * rng.choice([0.0001, 0.01, 0.1, 0.3, 0.7])) or 1
    hc = (lambda: 0.0) if rng.random() < 0.6 else (lambda: rng.choice([0.0, 10 ** rng.uniform(-7, -3)]))
    p = Profile(
        signature=f"fuzz-{seed}",
        forward_seconds=t + (0.0 if rng.random() < 0.6 else rng.uniform(0, t + 1e-3)),
        backward_seconds=0.0 if rng.random() < 0.5 else rng.uniform(0, 3) * (t + 1e-3),
        d2h_gbps=d2h,
        h2d_gbps=h2d,
        regions=regions,
        root=roots,
        host_limit_bytes=host_limit,
        replay_op_seconds=0.0 if rng.random() < 0.6 else rng.choice([1e-6, 1e-4, 0.05, 0.3]),
        pack_host_seconds=hc(),
        unpack_host_seconds=hc(),
        capture_host_seconds=hc(),
        offload_host_seconds=hc(),
        reload_host_seconds=hc(),
        replay_host_seconds=hc(),
        native_keep=rng.random() < 0.3,
    )
    if all_zero:
        p.forward_seconds = p.backward_seconds = 0.0
    return p


def n_storages(p: Profile) -> int:
    return sum(len(r.storages) for r in p.regions) + len(p.root)
