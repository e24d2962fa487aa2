"""Seven defects of long-lived processes and optimizer loops, one check each; prints
each check's result and exits 1 while any defect holds.

    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/results/cpu-2026-12-07h/repro_lifecycle.py
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
from torch import nn

import offrecomp


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, st: object = None) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.ln(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def x(i: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(i))


def freed_by_refcounting() -> bool:
    m = Net()
    warm = offrecomp.runtime(m, mode="recompute")
    with warm:
        m(x(0)).sum().backward()
    del warm
    gc.collect()
    gc.disable()
    try:
        m = Net()
        rt = offrecomp.runtime(m, mode="recompute")
        with rt:
            for i in range(3):
                m(x(i)).sum().backward()
        ref = weakref.ref(m)
        del m, rt
        return ref() is None
    finally:
        gc.enable()


def generator_closed_elsewhere() -> bool:
    m = Net()

    def steps() -> Iterator[None]:
        with offrecomp.runtime(m, mode="recompute"):
            while True:
                m(x(0)).sum().backward()
                yield

    it = steps()
    next(it)
    t = threading.Thread(target=it.close)  # its exception, if any, is the thread's
    t.start()
    t.join()
    try:
        with offrecomp.runtime(Net(), mode="recompute"):
            pass
        return True
    except RuntimeError:
        return False


def fused_step_after_pass_ended() -> bool:
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.5, fused=True)
    for q in m.parameters():
        q.grad = torch.ones_like(q)
    with offrecomp.runtime(m, mode="recompute"):
        la, lb = m(x(0)).square().sum(), m(x(1)).square().sum()
        la.backward()
        m(x(2))
        opt.step()
        try:
            lb.backward()
        except RuntimeError as e:
            return "stepped by an optimizer" in str(e)
    return False


def accumulation_is_one_step() -> bool:
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with offrecomp.runtime(m, mode="recompute") as rt:
        for _ in range(2):
            for i in range(20):
                m(x(i)).sum().backward()
            opt.step()
            opt.zero_grad()
    return [s.passes for s in rt.report().steps] == [20, 20]


def second_model_warned() -> bool:
    def model(name: str) -> nn.Module:
        class Book(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Linear(16, 16)
                self.register_buffer("book", torch.ones(300_000))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                y = torch.tanh(self.fc(x)) * (self.book[:16] * 1.0)
                with torch.no_grad():
                    self.book.mul_(0.5)
                return y

        Book.__qualname__ = name
        return nn.Sequential(Book(), Book())

    seen = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Catch()
    logging.getLogger("offrecomp").addHandler(handler)
    try:
        counts = []
        for name in ("BookA", "BookB"):
            seen.clear()
            m = model(name)
            with offrecomp.runtime(m, mode="recompute", regions=lambda mod, _, n=name: type(mod).__qualname__ == n):
                m(x(0)).sum().backward()
            counts.append(sum("larger than 1 MiB" in s for s in seen))
    finally:
        logging.getLogger("offrecomp").removeHandler(handler)
    return counts == [2, 2]


def export_inside() -> bool:
    m = Net().eval()
    with offrecomp.runtime(m, mode="recompute"):
        m(x(0)).sum().backward()
        try:
            torch.export.export(m, (x(1),))
        except AttributeError:
            return False
    return True


def class_per_call_freed() -> bool:
    made: list[weakref.ref[type]] = []

    class Stateful(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            state = dataclasses.make_dataclass("State", [("scale", float)])
            made.append(weakref.ref(state))
            st = state(1.0)
            for b in self.blocks:
                x = b(x, st)
            return x

    m = Stateful()
    with offrecomp.runtime(m, mode="recompute"):
        for i in range(10):
            m(x(i)).sum().backward()
    gc.collect()
    return not any(r() is not None for r in made)


CHECKS: list[tuple[str, Callable[[], bool]]] = [
    ("del model, rt frees the model with the collector off", freed_by_refcounting),
    ("a fused step after a metric forward ended the pass stops the replay", fused_step_after_pass_ended),
    ("20 micro-batches before the first optimizer step are one record", accumulation_is_one_step),
    ("a second model's region of the same name is warned about a 1 MiB buffer", second_model_warned),
    ("torch.export inside with rt", export_inside),
    ("a class made per forward is not kept", class_per_call_freed),
    # last: before the fix, the runtime it leaves active refuses every later one
    ("a training generator closed on another thread leaves its runtime", generator_closed_elsewhere),
]


def main() -> int:
    bad = 0
    for name, check in CHECKS:
        try:
            ok, why = check(), ""
        except Exception as e:
            ok, why = False, f" ({type(e).__name__}: {str(e)[:80]})"
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
