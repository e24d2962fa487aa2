"""Sweep: offrecomp with DataLoader worker processes and torch.multiprocessing children.
The parent trains the tiny model of common.py (3 blocks, width 32, dropout 0.1) for 4
steps under each variant and compares grads/buffers/loss bitwise with a plain run (run
twice); children report their own results through a queue (numpy arrays), compared with
references the parent computes plainly. Every child is joined with a timeout (a hang is
a finding).

Cases (each under keep, recompute, offload, auto, auto_tight, auto_serve):
  dl_fork_iter_before      DataLoader(num_workers=2, fork), its iterator (the workers)
                           started before `with rt:`, consumed inside.
  dl_fork_inside           DataLoader created and iterated inside `with rt:` (fork happens
                           inside the runtime, after offload's emulated streams started:
                           a fresh iterator per step 1.. so forks happen mid-training).
  dl_spawn_inside          same with multiprocessing_context="spawn".
  dl_fork_grad_dataset     fork workers inside the runtime whose __getitem__ runs its own
                           autograd (torch.autograd.grad of a small function): the worker
                           inherits the forking thread's saved-tensor hook stack.
  mp_fork_plain_child      between forward and backward of step 1 (saves in flight), a
                           torch.multiprocessing fork child trains its own model C plainly
                           for 3 steps; its grads must equal C's plain reference.
  mp_fork_offrecomp_child  same child, but it trains C under offrecomp.runtime(C, mode=v).
  mp_spawn_offrecomp_child spawn child trains C under offrecomp.runtime(C, mode=v).
  mp_fork_after_exit       control: fork after the runtime exited, child uses offrecomp.

Run:
  cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05y/sweep_procs.py [NAME,..|all] [VARIANT,..] [-v]
"""

from __future__ import annotations

import copy
import sys
import traceback

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py
from common import (  # noqa: E402
    IN, ZOO_VARIANTS, assert_bitwise, batch, books, clean, finish, fwd, make, make_rt, offrecomp,
    plain_det, run_cases, seed_all, snap, torch, octx, tc,
)
import torch.multiprocessing as mp  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

STEPS = 4


class DS(Dataset):
    def __len__(self):
        return STEPS

    def __getitem__(self, i):
        return batch(10 * i)


class GradDS(Dataset):
    """A dataset whose items come out of a small autograd computation."""

    def __len__(self):
        return STEPS

    def __getitem__(self, i):
        x = batch(10 * i)
        w = torch.linspace(0.5, 1.5, IN, requires_grad=True)
        y = torch.tanh(x * w).pow(2).sum()
        (g,) = torch.autograd.grad(y, w)
        return x + 0.01 * g


def plain_loader_ref(model, ds):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    for s in range(STEPS):
        seed_all(10 * s)
        loss = m(ds[s])
        loss.backward()
        out.append(finish(m, opt, loss))
    return out


def _dl_train(m, rt, make_loader, fresh_per_step, it0=None):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    with rt:
        if fresh_per_step:
            for s in range(STEPS):
                loader = make_loader()
                # forks now (each step: forks after the runtime has run steps)
                xs = list(loader)
                x = xs[s]
                seed_all(10 * s)
                loss = m(x)
                loss.backward()
                out.append(finish(m, opt, loss))
        else:
            it = it0 if it0 is not None else iter(make_loader())
            for s, x in enumerate(it):
                seed_all(10 * s)
                loss = m(x)
                loss.backward()
                out.append(finish(m, opt, loss))
    return out


def c_dl_fork_iter_before(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    loader = DataLoader(DS(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    it = iter(loader)  # workers forked before the runtime
    got = _dl_train(m2, rt, None, False, it0=it)
    assert_bitwise(ref, got)
    books(rt, v, STEPS)
    clean(m2)


def c_dl_fork_inside(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    got = _dl_train(m2, rt, lambda: DataLoader(DS(), batch_size=None, num_workers=2,
                                               multiprocessing_context="fork"), True)
    assert_bitwise(ref, got)
    books(rt, v, STEPS)
    clean(m2)


def c_dl_spawn_inside(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    got = _dl_train(m2, rt, lambda: DataLoader(DS(), batch_size=None, num_workers=2,
                                               multiprocessing_context="spawn"), False)
    assert_bitwise(ref, got)
    books(rt, v, STEPS)
    clean(m2)


def c_dl_fork_grad_dataset(v):
    m = make()
    ds = GradDS()
    ref = plain_loader_ref(m, ds)
    assert_bitwise(ref, plain_loader_ref(m, ds))
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    got = _dl_train(m2, rt, lambda: DataLoader(ds, batch_size=None, num_workers=2,
                                               multiprocessing_context="fork"), True)
    assert_bitwise(ref, got)
    books(rt, v, STEPS)
    clean(m2)


# ------------------------------------------------------- multiprocessing children

def child_train(q, mode, state_bytes):
    """Train model C for 3 steps (plainly if mode is None, else under offrecomp) and put
    (status, grads as numpy, info) on q."""
    try:
        import io
        c = make(7)
        c.load_state_dict(torch.load(io.BytesIO(state_bytes)))
        info = {
            "hooks_at_start": tc.top_saved_tensors_hooks() is not None,
            "active_at_start": octx._active is not None,
        }
        opt = torch.optim.SGD(c.parameters(), lr=0.1)
        out = []
        import contextlib
        ctx = contextlib.nullcontext() if mode is None else make_rt(c, mode)
        with ctx:
            for s in range(3):
                loss = fwd(c, s)
                loss.backward()
                out.append({k: t.numpy() for k, t in finish(c, opt, loss).items()})
        info["records"] = len(ctx.report().steps) if mode is not None else None
        q.put(("ok", out, info))
    except BaseException as e:  # noqa: BLE001
        q.put(("error", f"{type(e).__name__}: {str(e)[:300]}", traceback.format_exc()[-800:]))


def _state_bytes(model):
    import io
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def _child_case(v, ctx_name, child_mode, when):
    """Parent trains A under v; the child (ctx_name) trains C (mode child_mode) started at
    `when`: 'mid' (between forward and backward of step 1, inside the runtime) or
    'after' (after the runtime exited)."""
    a = make(0)
    ref_a = plain_det(a)
    c = make(7)
    ref_c = plain_det(c, 3)
    a2 = copy.deepcopy(a)
    rt = make_rt(a2, v)
    ctx = mp.get_context(ctx_name)
    q = ctx.SimpleQueue()
    proc = None
    opt = torch.optim.SGD(a2.parameters(), lr=0.1)
    out = []
    sb = _state_bytes(c)
    with rt:
        for s in range(STEPS):
            loss = fwd(a2, s)
            if s == 1 and when == "mid":
                proc = ctx.Process(target=child_train, args=(q, child_mode, sb))
                proc.start()
            loss.backward()
            out.append(finish(a2, opt, loss))
    if when == "after":
        proc = ctx.Process(target=child_train, args=(q, child_mode, sb))
        proc.start()
    # read before join: the payload is larger than a pipe's buffer
    import time as _t
    t0 = _t.time()
    res = None
    while _t.time() - t0 < 140:
        if not q.empty():
            res = q.get()
            break
        if not proc.is_alive() and q.empty():
            break
        _t.sleep(0.05)
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        raise AssertionError(f"child process hung ({ctx_name}, child mode {child_mode})")
    assert_bitwise(ref_a, out)
    books(rt, v, STEPS)
    clean(a2)
    assert res is not None, f"child exited {proc.exitcode} without a result"
    status, payload, info = res
    if status != "ok":
        raise AssertionError(f"child ({ctx_name}, mode {child_mode}) failed: {payload}")
    got_c = [{k: torch.from_numpy(x) for k, x in d.items()} for d in payload]
    assert_bitwise(ref_c, got_c)
    return f"(child: hooks inherited={info['hooks_at_start']}, runtime marked active={info['active_at_start']}, records={info['records']})"


def c_mp_fork_plain_child(v):
    return _child_case(v, "fork", None, "mid")


def c_mp_fork_offrecomp_child(v):
    return _child_case(v, "fork", v, "mid")


def c_mp_spawn_offrecomp_child(v):
    return _child_case(v, "spawn", v, "mid")


def c_mp_fork_after_exit(v):
    return _child_case(v, "fork", v, "after")


CASES = [(n[2:], f) for n, f in list(globals().items()) if n.startswith("c_") and callable(f)]

if __name__ == "__main__":
    sys.exit(run_cases(CASES, lambda name: ZOO_VARIANTS))
