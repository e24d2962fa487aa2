"""Sweep: offrecomp under threads, several runtimes, async, generators, thread settings
and signals. Every case trains the tiny model of common.py (3 blocks, width 32, dropout
0.1 unless said) for 4 steps and compares grads/buffers/loss bitwise (torch.equal on
the bits) with a plain run of an identical deep copy with the same seeds; the plain run
is itself run twice and compared. Books: tests.helpers.check_variant_report plus peak
and saved_tensors > 0 per step. "clean": no hook pair left on the thread, no active
runtime, backward entry unpatched, no wrapped forwards.

Cases (each under keep, recompute, offload, auto, auto_tight, auto_serve):
  thread_loop_rt_from_main    runtime created in main; `with rt:` and the whole loop in a
                              threading.Thread.
  thread_loop_rt_in_worker    runtime created and used in the worker thread.
  enter_main_loop_in_worker   `with rt:` entered in main, loop in a worker (documented:
                              forwards run plainly with a warning); grads bitwise, warning.
  two_threads_two_runtimes    thread A trains under rtA; while A is between forward and
                              backward, thread B enters rtB on model B: must raise a clear
                              RuntimeError; after A exits, B trains under rtB. Both bitwise.
  interleave_rt_and_plain     barriers: A fwd (rt) | B fwd (plain, other model, other
                              thread) | A bwd | B bwd | B opt.step | A opt.step. Both
                              bitwise; A's books equal (bytes, tensors, replays) a solo run.
  probe_during_replay         model A's block calls back to thread B from inside its
                              replay (or from its forward when nothing replays): B checks
                              offrecomp.in_replay() is False on B and runs a plain
                              forward/backward/step of model B (dropout 0) meanwhile.
  free_running_other_thread   no barriers: main trains A under rt for 6 steps while a
                              thread trains B plainly (dropout 0) with its own optimizer,
                              as fast as it can; both bitwise; A's books == solo books.
  backward_in_worker          forward in main (rt in main), loss.backward() in a thread.
  fwd_worker_rt_bwd_main      `with rt:` and forward in a worker, backward in main, the
                              optimizer step back in the worker.
  fwd_in_worker_rt_in_main    `with rt:` in main, forward in a worker, backward in main
                              (documented: forward plain, warned).
  threadpool_subbatches       ThreadPoolExecutor(2): forward of two half batches of one
                              model (dropout 0) in parallel threads, inside `with rt:` in
                              main, then one backward (documented: workers run plainly).
  threadpool_main_and_worker  same, first half on main, second on a pool thread.
  num_threads_toggle          torch.set_num_threads(2) on even steps, 1 on odd (plain too).
  multithreading_disabled     torch.autograd.set_multithreading_enabled(False) around loop.
  asyncio_steps               asyncio coroutine: forward, await sleep(0), backward, step.
  asyncio_two_tasks           asyncio: task A under rt and task B (plain model B) on the
                              same thread interleaved at awaits (documented limit: B's
                              saves join A's pass); grads of both checked.
  generator_resumed           generator with `with rt:` inside yields between forward and
                              backward; the caller runs backward and resumes later.
  generator_abandoned         the generator is closed mid-step (after forward), then a
                              normal loop under the same runtime; and a fresh one.
  two_runtimes_alternating    rtA step on A, rtB step on B, alternating in one thread.
  nested_runtime_in_forward   model A's forward enters rtB around model B (runtimes do not
                              nest): the error must be clear; A's next steps bitwise.
  nested_runtime_around       `with rtB:` then `with rtA:` inside it: clear error.
  sigalrm_mid_forward         a SIGALRM handler raises TimeoutError while a block's
                              forward sleeps at step 1; step retried; all bitwise, clean.
  sigalrm_mid_replay          same, while a block's replay (in backward) sleeps.
  sigalrm_random              itimer fires TimeoutError at pseudo-random moments for
                              many steps (failed steps retried); the completed steps
                              bitwise, clean after.

Run:
  cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05y/sweep_threads.py [NAME,..|all] [VARIANT,..] [-v]
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import copy
import logging
import queue
import random
import signal
import sys
import threading
import time

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py
from common import *  # noqa: F401,F403
from common import (
    ZOO_VARIANTS, Net, assert_bitwise, batch, batch_b, books, clean, finish, fwd, make,
    make_rt, offrecomp, plain, plain_det, run_cases, seed_all, snap, tc, torch, nn, octx,
)

STEPS = 4


class Catch(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


def catching():
    from offrecomp import diagnostics
    diagnostics.clear_warnings()  # warnings are once per process
    h = Catch()
    logging.getLogger("offrecomp").addHandler(h)
    return h


def in_thread(fn, *a):
    out = {}

    def body():
        try:
            out["r"] = fn(*a)
        except BaseException as e:  # noqa: BLE001
            out["e"] = e

    t = threading.Thread(target=body, name="worker")
    t.start()
    t.join(120)
    assert not t.is_alive(), "thread hung"
    if "e" in out:
        raise out["e"]
    return out.get("r")


def loop(model, rt, steps=STEPS, b=batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    with rt:
        for s in range(steps):
            loss = fwd(model, s, b)
            loss.backward()
            out.append(finish(model, opt, loss))
    return out


def solo_books(model, v, steps=STEPS):
    m = copy.deepcopy(model)
    rt = make_rt(m, v)
    loop(m, rt, steps)
    return rt.report().steps


def same_books(a, b, v):
    """A's records equal a solo run's. Timing-dependent figures are left out: offload's
    peak (emulated copies in flight) and auto's plan choice (measured times); for auto
    the placed total (kept+offloaded+recomputed) is compared instead."""
    keys = ["passes", "phase", "saved_tensors", "storages"]
    if v in ("keep", "recompute"):
        keys += ["kept_bytes", "offloaded_bytes", "recomputed_bytes", "input_bytes", "peak_activation_bytes", "replays"]
    elif v == "offload":
        keys += ["kept_bytes", "offloaded_bytes", "recomputed_bytes", "replays"]
    assert len(a) == len(b), f"{len(a)} step records, solo run {len(b)}"
    tot = lambda r: r.kept_bytes + r.offloaded_bytes + r.recomputed_bytes
    for x, y in zip(a, b):
        dx = {k: getattr(x, k) for k in keys} | {"placed": tot(x)}
        dy = {k: getattr(y, k) for k in keys} | {"placed": tot(y)}
        assert dx == dy, f"step {x.step}: books {dx} != solo {dy}"


# ---------------------------------------------------------------- cases

def c_thread_loop_rt_from_main(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    got = in_thread(lambda: (loop(m2, rt), clean(m2))[0])
    assert_bitwise(ref, got)
    books(rt, v, STEPS)
    clean(m2)


def c_thread_loop_rt_in_worker(v):
    m = make()
    ref = plain_det(m)

    def body():
        m2 = copy.deepcopy(m)
        rt = make_rt(m2, v)
        got = loop(m2, rt)
        books(rt, v, STEPS)
        clean(m2)
        return got

    assert_bitwise(ref, in_thread(body))
    clean()


def c_enter_main_loop_in_worker(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    h = catching()
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)

    def body():
        out = []
        for s in range(STEPS):
            loss = fwd(m2, s)
            loss.backward()
            out.append(finish(m2, opt, loss))
        return out

    with rt:
        got = in_thread(body)
    logging.getLogger("offrecomp").removeHandler(h)
    assert_bitwise(ref, got)
    clean(m2)
    warned = any("did not enter" in x for x in h.msgs)
    assert warned, f"no warning: {h.msgs}"
    return f"(documented; warned; {len(rt.report().steps)} step records)"


def c_two_threads_two_runtimes(v):
    a = make(0)
    b = make(1)
    ref_a = plain_det(a)
    ref_b = plain_det(b, b=batch_b)
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    rta, rtb = make_rt(a2, v), make_rt(b2, v, b=batch_b)
    bar = threading.Barrier(2, timeout=60)
    res = {}

    def ta():
        opt = torch.optim.SGD(a2.parameters(), lr=0.1)
        out = []
        with rta:
            for s in range(STEPS):
                loss = fwd(a2, s)
                if s == 1:
                    bar.wait()  # B tries now
                    bar.wait()
                loss.backward()
                out.append(finish(a2, opt, loss))
        res["a"] = out

    def tb():
        bar.wait()
        try:
            with rtb:
                pass
            res["b_err"] = None
        except RuntimeError as e:
            res["b_err"] = str(e)
        bar.wait()

    t1 = threading.Thread(target=lambda: _guard(ta, res, "ea"))
    t2 = threading.Thread(target=lambda: _guard(tb, res, "eb"))
    t1.start(); t2.start(); t1.join(120); t2.join(120)
    assert not t1.is_alive() and not t2.is_alive(), "hang"
    for k in ("ea", "eb"):
        if k in res:
            raise res[k]
    assert res["b_err"] and "already active" in res["b_err"], f"B entered a second runtime: {res['b_err']!r}"
    assert_bitwise(ref_a, res["a"])
    books(rta, v, STEPS)
    # now B trains under its runtime in a thread
    got_b = in_thread(lambda: loop(b2, rtb, b=batch_b))
    assert_bitwise(ref_b, got_b)
    books(rtb, v, STEPS)
    clean(a2); clean(b2)


def _guard(fn, res, key):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        res[key] = e


def c_interleave_rt_and_plain(v):
    a = make(0)
    b = make(1)
    ref_a = plain_det(a)
    ref_b = plain_det(b, b=batch_b)
    solo = solo_books(a, v)
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    rta = make_rt(a2, v)
    bar = threading.Barrier(2, timeout=60)
    res = {}

    def ta():
        opt = torch.optim.SGD(a2.parameters(), lr=0.1)
        out = []
        with rta:
            for s in range(STEPS):
                loss = fwd(a2, s)          # 1: A fwd
                bar.wait(); bar.wait()     # 2: B fwd
                loss.backward()            # 3: A bwd
                bar.wait(); bar.wait()     # 4: B bwd + B opt.step
                out.append(finish(a2, opt, loss))  # 5: A opt.step
                bar.wait()
        res["a"] = out

    def tb():
        opt = torch.optim.SGD(b2.parameters(), lr=0.1)
        out = []
        for s in range(STEPS):
            bar.wait()
            loss = fwd(b2, s, batch_b)
            assert not offrecomp.in_replay()
            bar.wait(); bar.wait()
            loss.backward()
            out.append(finish(b2, opt, loss))
            bar.wait()
            bar.wait()
        res["b"] = out

    t1 = threading.Thread(target=lambda: _guard(ta, res, "ea"))
    t2 = threading.Thread(target=lambda: _guard(tb, res, "eb"))
    t1.start(); t2.start(); t1.join(120); t2.join(120)
    assert not t1.is_alive() and not t2.is_alive(), "hang"
    for k in ("ea", "eb"):
        if k in res:
            raise res[k]
    assert_bitwise(ref_a, res["a"])
    assert_bitwise(ref_b, res["b"])
    books(rta, v, STEPS)
    same_books(rta.report().steps, solo, v)
    clean(a2)


class ProbeBlock(nn.Module):
    def __init__(self, inner, probe):
        super().__init__()
        self.inner = inner
        self.probe = [probe]

    def forward(self, x):
        self.probe[0](offrecomp.in_replay())
        return self.inner(x)


def c_probe_during_replay(v):
    a = make(0)
    b = make(1, p=0.0)
    ref_a = plain_det(a)
    ref_b = plain_det(b, b=batch_b)
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    rta = make_rt(a2, v)
    optb = torch.optim.SGD(b2.parameters(), lr=0.1)
    req, ans = queue.Queue(), queue.Queue()
    got_b = []
    seen = {"replay_probes": 0, "fwd_probes": 0}

    def worker():
        s = 0
        while True:
            item = req.get()
            if item is None:
                return
            try:
                r = offrecomp.in_replay()
                depth = offrecomp.replay._tls.depth
                loss = b2(batch_b(10 * s))  # dropout 0: draws nothing
                loss.backward()
                got_b.append(finish(b2, optb, loss))
                s += 1
                ans.put((r, depth, None))
            except BaseException as e:  # noqa: BLE001
                ans.put((None, None, e))

    th = threading.Thread(target=worker)
    th.start()
    state = {"want": 0}

    def probe(replaying):
        # block 1's forward: ask B to run one step now, at most once per A step
        if state["want"] > 0 and (replaying or not can_replay):
            state["want"] -= 1
            seen["replay_probes" if replaying else "fwd_probes"] += 1
            req.put(1)
            r, depth, e = ans.get(timeout=60)
            if e is not None:
                raise e
            assert r is False, "in_replay() True on thread B while A replays"
            assert depth == 0, f"replay depth {depth} on thread B"

    can_replay = v not in ("keep", "offload")
    a2.blocks[1] = ProbeBlock(a2.blocks[1], probe)
    rta = make_rt(a2, v)
    opt = torch.optim.SGD(a2.parameters(), lr=0.1)
    out = []
    try:
        with rta:
            for s in range(STEPS):
                state["want"] = 1 if not can_replay else 0
                loss = fwd(a2, s)
                state["want"] = 1 if can_replay else 0
                loss.backward()
                if state["want"]:  # nothing replayed block 1 this step: B runs now
                    state["want"] = 0
                    seen["after_bwd"] = seen.get("after_bwd", 0) + 1
                    req.put(1)
                    r, depth, e = ans.get(timeout=60)
                    if e is not None:
                        raise e
                out.append(finish(a2, opt, loss))
    finally:
        req.put(None)
        th.join(60)
    ref_a_names = ref_a
    # rename keys of the wrapped block to compare
    fixed = [{k.replace("blocks.1.inner.", "blocks.1."): t for k, t in d.items()} for d in out]
    assert_bitwise(ref_a_names, fixed)
    assert_bitwise(ref_b[: len(got_b)], got_b)
    assert len(got_b) == STEPS, len(got_b)
    books(rta, v, STEPS)
    clean(a2)
    return f"(B ran {seen['replay_probes']} times inside A's replays, {seen['fwd_probes']} in A's forward, {seen.get('after_bwd', 0)} after A's backward)"


def c_free_running_other_thread(v):
    steps = 6
    a = make(0)
    b = make(1, p=0.0)
    ref_a = plain_det(a, steps)
    nb = 40
    ref_b = plain_det(b, nb, b=batch_b)
    solo = solo_books(a, v, steps)
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    rta = make_rt(a2, v)
    stop = threading.Event()
    res = {}

    def tb():
        opt = torch.optim.SGD(b2.parameters(), lr=0.1)
        out = []
        for s in range(nb):
            loss = b2(batch_b(10 * s))
            loss.backward()
            out.append(finish(b2, opt, loss))
            time.sleep(0.001)
        res["b"] = out

    t = threading.Thread(target=lambda: _guard(tb, res, "eb"))
    t.start()
    got_a = loop(a2, rta, steps)
    t.join(120)
    assert not t.is_alive(), "hang"
    if "eb" in res:
        raise res["eb"]
    assert_bitwise(ref_a, got_a)
    assert_bitwise(ref_b, res["b"])
    books(rta, v, steps)
    same_books(rta.report().steps, solo, v)
    clean(a2)


def c_backward_in_worker(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)
    out = []
    with rt:
        for s in range(STEPS):
            loss = fwd(m2, s)
            in_thread(loss.backward)
            out.append(finish(m2, opt, loss))
    assert_bitwise(ref, out)
    books(rt, v, STEPS)
    clean(m2)


def c_fwd_worker_rt_bwd_main(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    to_main, to_worker = queue.Queue(), queue.Queue()
    res = {}

    def worker():
        opt = torch.optim.SGD(m2.parameters(), lr=0.1)
        out = []
        with rt:
            for s in range(STEPS):
                loss = fwd(m2, s)
                to_main.put(loss)
                assert to_worker.get(timeout=60) == "done"
                out.append(finish(m2, opt, loss))
        res["out"] = out

    t = threading.Thread(target=lambda: (_guard(worker, res, "e"), to_main.put(None)))
    t.start()
    err = None
    while True:
        loss = to_main.get(timeout=100)
        if loss is None:
            break
        try:
            loss.backward()
        except BaseException as e:  # noqa: BLE001
            err = err or e
        to_worker.put("done")
    t.join(60)
    if err:
        raise err
    if "e" in res:
        raise res["e"]
    assert_bitwise(ref, res["out"])
    books(rt, v, STEPS)
    clean(m2)
    in_thread(lambda: clean(m2))


def c_fwd_in_worker_rt_in_main(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    h = catching()
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)
    out = []
    with rt:
        for s in range(STEPS):
            loss = in_thread(fwd, m2, s)
            loss.backward()
            out.append(finish(m2, opt, loss))
    logging.getLogger("offrecomp").removeHandler(h)
    assert_bitwise(ref, out)
    clean(m2)
    warned = any("did not enter" in x for x in h.msgs)
    assert warned, f"no warning: {h.msgs}"
    return f"(documented; warned; {len(rt.report().steps)} records)"


def _pool_train(model, ctx, steps, main_first: bool):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    with ctx, cf.ThreadPoolExecutor(2) as ex:
        for s in range(steps):
            seed_all(10 * s)
            x = batch(10 * s)
            h1, h2 = x[:2], x[2:]
            if main_first:
                f2 = ex.submit(model, h2)
                l1 = model(h1)
                l2 = f2.result()
            else:
                f1, f2 = ex.submit(model, h1), ex.submit(model, h2)
                l1, l2 = f1.result(), f2.result()
            loss = l1 + l2
            loss.backward()
            out.append(finish(model, opt, loss))
    return out


def _threadpool(v, main_first):
    import contextlib
    m = make(p=0.0)
    ref = _pool_train(copy.deepcopy(m), contextlib.nullcontext(), STEPS, main_first)
    ref2 = _pool_train(copy.deepcopy(m), contextlib.nullcontext(), STEPS, main_first)
    assert_bitwise(ref, ref2)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    h = catching()
    got = _pool_train(m2, rt, STEPS, main_first)
    logging.getLogger("offrecomp").removeHandler(h)
    assert_bitwise(ref, got)
    clean(m2)
    warned = any("did not enter" in x for x in h.msgs)
    st = rt.report().steps
    if main_first:
        books(rt, v, STEPS)
    return f"(documented: pool threads plain; warned={warned}; {len(st)} records)"


def c_threadpool_subbatches(v):
    return _threadpool(v, False)


def c_threadpool_main_and_worker(v):
    return _threadpool(v, True)


def _toggle_train(model, ctx, steps):
    import contextlib
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    try:
        with ctx if ctx is not None else contextlib.nullcontext():
            for s in range(steps):
                torch.set_num_threads(2 if s % 2 == 0 else 1)
                loss = fwd(model, s)
                torch.set_num_threads(1 if s % 2 == 0 else 2)  # backward on the other count
                loss.backward()
                out.append(finish(model, opt, loss))
    finally:
        torch.set_num_threads(1)
    return out


def c_num_threads_toggle(v):
    m = make()
    ref = _toggle_train(copy.deepcopy(m), None, STEPS)
    assert_bitwise(ref, _toggle_train(copy.deepcopy(m), None, STEPS))
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    assert_bitwise(ref, _toggle_train(m2, rt, STEPS))
    books(rt, v, STEPS)
    clean(m2)


def c_multithreading_disabled(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    with torch.autograd.set_multithreading_enabled(False):
        got = loop(m2, rt)
    assert_bitwise(ref, got)
    books(rt, v, STEPS)
    clean(m2)


def c_asyncio_steps(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)

    async def main():
        opt = torch.optim.SGD(m2.parameters(), lr=0.1)
        out = []
        with rt:
            for s in range(STEPS):
                loss = fwd(m2, s)
                await asyncio.sleep(0)
                loss.backward()
                await asyncio.sleep(0)
                out.append(finish(m2, opt, loss))
        return out

    assert_bitwise(ref, asyncio.run(main()))
    books(rt, v, STEPS)
    clean(m2)


def c_asyncio_two_tasks(v):
    a = make(0)
    b = make(1)
    ref_a = plain_det(a)
    ref_b = plain_det(b, b=batch_b)
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    rta = make_rt(a2, v)

    async def ta(ev):
        opt = torch.optim.SGD(a2.parameters(), lr=0.1)
        out = []
        with rta:
            for s in range(STEPS):
                loss = fwd(a2, s)
                ev["a_fwd"].set(); await ev["b_fwd"].wait(); ev["b_fwd"].clear()
                loss.backward()
                out.append(finish(a2, opt, loss))
                ev["a_done"].set(); await ev["b_done"].wait(); ev["b_done"].clear()
        return out

    async def tb(ev):
        opt = torch.optim.SGD(b2.parameters(), lr=0.1)
        out = []
        for s in range(STEPS):
            await ev["a_fwd"].wait(); ev["a_fwd"].clear()
            loss = fwd(b2, s, batch_b)
            ev["b_fwd"].set()
            await ev["a_done"].wait(); ev["a_done"].clear()
            loss.backward()
            out.append(finish(b2, opt, loss))
            ev["b_done"].set()
        return out

    async def main():
        ev = {k: asyncio.Event() for k in ("a_fwd", "b_fwd", "a_done", "b_done")}
        return await asyncio.gather(ta(ev), tb(ev))

    ga, gb = asyncio.run(main())
    assert_bitwise(ref_a, ga)
    assert_bitwise(ref_b, gb)
    clean(a2)
    st = rta.report().steps
    return f"(documented limit: B joins A's passes; {len(st)} records)"


def _gen_loop(model, rt, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rt:
        for s in range(steps):
            loss = fwd(model, s)
            yield loss
            yield finish(model, opt, loss)


def c_generator_resumed(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    g = _gen_loop(m2, rt, STEPS)
    out = []
    for s in range(STEPS):
        loss = next(g)
        time.sleep(0.01)  # resumed later
        loss.backward()
        out.append(next(g))
    try:
        next(g)
    except StopIteration:
        pass
    assert_bitwise(ref, out)
    books(rt, v, STEPS)
    clean(m2)


def c_generator_abandoned(v):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    g = _gen_loop(m2, rt, STEPS)
    loss = next(g)  # forward of step 0, inside the generator's `with rt:`
    g.close()       # abandoned mid-step
    del loss
    clean(m2)
    # then normally, same runtime
    out = []
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)
    with rt:
        for s in range(STEPS):
            loss = fwd(m2, s)
            loss.backward()
            out.append(finish(m2, opt, loss))
    assert_bitwise(ref, out)
    st = rt.report().steps
    clean(m2)
    # and a fresh runtime on a fresh copy after an abandoned generator
    m3 = copy.deepcopy(m)
    rt3 = make_rt(m3, v)
    g = _gen_loop(m3, rt3, STEPS)
    loss = next(g)
    loss.backward()
    g.close()  # abandoned after backward, before the optimizer step
    clean(m3)
    m4 = copy.deepcopy(m)
    rt4 = make_rt(m4, v)
    assert_bitwise(ref, loop(m4, rt4))
    books(rt4, v, STEPS)
    clean(m4)
    return f"({len(st)} records on the reused runtime: {[s.phase for s in st]})"


def c_two_runtimes_alternating(v):
    a, b = make(0), make(1)
    ref_a = plain_det(a)
    ref_b = plain_det(b, b=batch_b)
    a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
    rta, rtb = make_rt(a2, v), make_rt(b2, v, b=batch_b)
    oa = torch.optim.SGD(a2.parameters(), lr=0.1)
    ob = torch.optim.SGD(b2.parameters(), lr=0.1)
    ga, gb = [], []
    for s in range(STEPS):
        with rta:
            loss = fwd(a2, s)
            loss.backward()
            ga.append(finish(a2, oa, loss))
        with rtb:
            loss = fwd(b2, s, batch_b)
            loss.backward()
            gb.append(finish(b2, ob, loss))
    assert_bitwise(ref_a, ga)
    assert_bitwise(ref_b, gb)
    books(rta, v, STEPS)
    books(rtb, v, STEPS)
    clean(a2); clean(b2)


class Outer(nn.Module):
    def __init__(self, inner, rt_inner_box):
        super().__init__()
        self.net = make(0)
        self.inner = [inner]  # not a submodule
        self.box = rt_inner_box

    def forward(self, x):
        if self.box[0] is not None:
            with self.box[0]:
                y = self.inner[0](x)
        else:
            y = self.inner[0](x)
        return self.net(x) + y


def c_nested_runtime_in_forward(v):
    b = make(1)
    box = [None]
    a = Outer(b, box)
    ref = plain_det(a)
    a2 = copy.deepcopy(a)  # its inner is the same b (a list): share b across copies? no:
    b2 = copy.deepcopy(b)
    a2.inner = [b2]
    a2.box = box
    rta = make_rt(a2, v)
    rtb = make_rt(b2, "recompute")
    box[0] = rtb
    opt = torch.optim.SGD(a2.parameters(), lr=0.1)
    err = None
    with rta:
        try:
            loss = fwd(a2, 0)
        except RuntimeError as e:
            err = e
    assert err is not None, "a runtime entered inside another runtime's forward did not raise"
    msg = str(err)
    assert "already active" in msg and "nest" in msg, f"unclear error: {msg}"
    clean(a2); clean(b2)
    # then, without the inner runtime, A (with B plain inside) trains bitwise
    box[0] = None
    out = []
    with rta:
        for s in range(STEPS):
            loss = fwd(a2, s)
            loss.backward()
            out.append(finish(a2, opt, loss))
    # reference: grads of a's own params, b's are not a's parameters (a list)
    assert_bitwise(ref, out)
    clean(a2)
    return f"(error: {msg[:70]}...)"


def c_nested_runtime_around(v):
    a, b = make(0), make(1)
    rta, rtb = make_rt(a, v), make_rt(b, v, b=batch_b)
    err = None
    with rtb:
        try:
            with rta:
                pass
        except RuntimeError as e:
            err = str(e)
    assert err and "already active" in err, err
    clean(a); clean(b)
    ref = plain_det(make(0))
    m = make(0)
    rt = make_rt(m, v)
    assert_bitwise(ref, loop(m, rt))
    clean(m)


class SleepBlock(nn.Module):
    def __init__(self, inner, when):
        super().__init__()
        self.inner = inner
        self.when = when  # dict: {"fwd": bool, "replay": bool}

    def forward(self, x):
        r = offrecomp.in_replay()
        if (self.when["fwd"] and not r) or (self.when["replay"] and r):
            t0 = time.time()
            while time.time() - t0 < 2.0:  # the alarm lands here
                pass
        return self.inner(x)


def _alarm(signum, frame):
    raise TimeoutError("alarm")


def _sig_case(v, where):
    m = make()
    ref = plain_det(m)
    m2 = copy.deepcopy(m)
    when = {"fwd": False, "replay": False}
    m2.blocks[1] = SleepBlock(m2.blocks[1], when)
    rt = make_rt(m2, v)
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)
    old = signal.signal(signal.SIGALRM, _alarm)
    out = []
    fired = 0
    try:
        s = 0
        while s < STEPS:
            arm = s == 1 and fired == 0
            when[where] = arm
            if arm:
                signal.setitimer(signal.ITIMER_REAL, 0.3)
            try:
                with rt:
                    loss = fwd(m2, s)
                    loss.backward()
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    out.append(finish(m2, opt, loss))
                s += 1
            except TimeoutError:
                fired += 1
                when[where] = False
                opt.zero_grad(set_to_none=True)
                clean(m2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    fixed = [{k.replace("blocks.1.inner.", "blocks.1."): t for k, t in d.items()} for d in out]
    assert_bitwise(ref, fixed)
    clean(m2)
    can_replay = v not in ("keep", "offload")
    if where == "replay" and not can_replay:
        return "(no replay under this variant: the alarm never fired)" if fired == 0 else f"(fired {fired})"
    assert fired == 1, f"alarm fired {fired} times"
    return f"({len(rt.report().steps)} records)"


def c_sigalrm_mid_forward(v):
    return _sig_case(v, "fwd")


def c_sigalrm_mid_replay(v):
    return _sig_case(v, "replay")


def c_sigalrm_random(v):
    m = make()
    nsteps = 16
    ref = plain_det(m, nsteps)
    m2 = copy.deepcopy(m)
    rt = make_rt(m2, v)
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)
    rng = random.Random(1234)
    # the alarm's delay: uniform over 1.2x a step's duration under this variant
    mt = copy.deepcopy(m)
    rtt = make_rt(mt, v)
    t0 = time.perf_counter()
    loop(mt, rtt, 4)
    dur = (time.perf_counter() - t0) / 4
    old = signal.signal(signal.SIGALRM, _alarm)
    out = []
    fired = tries = 0
    gaps = []
    try:
        s = 0
        while s < nsteps and tries < 400:
            tries += 1
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 1.2 * dur))
            try:
                with rt:
                    loss = fwd(m2, s)
                    loss.backward()
                    snapd = snap(m2, loss)
                signal.setitimer(signal.ITIMER_REAL, 0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                out.append(snapd)
                s += 1
            except TimeoutError:
                fired += 1
                signal.setitimer(signal.ITIMER_REAL, 0)
                opt.zero_grad(set_to_none=True)
                if rt._entered:  # documented: an interrupt in the exit after the hooks came off
                    gaps.append(tries)
                    rt.__exit__(None, None, None)
                clean(m2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert s == nsteps, f"only {s} steps in {tries} tries"
    assert_bitwise(ref, out)
    clean(m2)
    rt.report()  # readable
    return f"(step {dur*1e3:.1f} ms; alarm raised {fired} times in {tries} tries; documented exit gap hit {len(gaps)}x)"


CASES = [(n[2:], f) for n, f in list(globals().items()) if n.startswith("c_") and callable(f)]


if __name__ == "__main__":
    sys.exit(run_cases(CASES, lambda name: ZOO_VARIANTS))
