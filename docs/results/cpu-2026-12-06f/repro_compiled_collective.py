"""auto mode replays a compiled block that calls dist.all_reduce on one rank alone.

A block compiled in place (block.compile(), the documented way to recompute compiled
blocks) whose forward calls torch.distributed.all_reduce is not recognised as a
collective region (the eager block is: "runs collectives: never recomputed"). Under
auto with a tight byte budget and per-rank sequence lengths (dynamic batches), rank 0
plans to recompute it and rank 1 does not; rank 0's replay all_reduce pairs with rank 1's
next forward all_reduce: rank 1 gets wrong gradients and rank 0 waits forever.

With "default" (no budget): rank 0 alone meets a longer batch, auto measures that new
signature by dropping every region, and rank 0's replays run all_reduce alone: same hang.

Exits 1 on the bug. Run: OMP_NUM_THREADS=1 python repro_compiled_collective.py [eager] [default]
"""
import datetime
import os
import socket
import sys
import tempfile

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

COMPILE = "eager" not in sys.argv[1:]
STEPS = 6
DEFAULT = "default" in sys.argv[1:]
# per-rank sequence lengths per step; "default": no byte budget, rank 0 meets a longer
# batch at step 1 (a new signature: auto measures it again, dropping every region)
LENS = {0: (8, 16, 16, 24, 16, 16), 1: (8,) * 6} if DEFAULT else {0: (16,) * 6, 1: (4,) * 6}
BUDGET = None if DEFAULT else 30_000


class Block(nn.Module):
    def __init__(self, h=32):
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 64)
        self.fc2 = nn.Linear(64, h)

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(self.ln(x))))
        s = y.detach().abs().mean().reshape(1).clone()
        dist.all_reduce(s)  # a statistic shared across ranks
        return x + y / (1.0 + s)


class Model(nn.Module):
    def __init__(self, h=32, vocab=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(Block(h) for _ in range(2))
        self.head = nn.Linear(h, vocab)
        if COMPILE:
            for b in self.blocks:
                b.compile(backend="aot_eager")

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), idx.flatten())


def train(rank, mode):
    import offrecomp

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    rt = offrecomp.runtime(model, mode=mode, budget=BUDGET, min_bytes=0) if mode else None
    if rt:
        rt.__enter__()
    try:
        for step in range(STEPS):
            idx = torch.randint(0, 64, (2, LENS[rank][step]), generator=torch.Generator().manual_seed(10 * step + rank))
            model(idx).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
    finally:
        if rt:
            rt.__exit__(None, None, None)
    return grads, rt


def worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    ref, _ = train(rank, None)
    ref2, _ = train(rank, None)
    det = all(torch.equal(a, b) for s1, s2 in zip(ref, ref2) for a, b in zip(s1, s2))
    dist.barrier()
    lines = [f"rank{rank}: plain deterministic: {det}"]
    with open(os.path.join(out, f"r{rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        got, rt = train(rank, "auto")
        replays = [s.replays for s in rt.report().steps]
        flagged = "runs collectives" in rt.explain()
        bad = [f"step{s} param{i}" for s, (g1, g2) in enumerate(zip(ref, got)) for i, (a, b) in enumerate(zip(g1, g2))
               if not torch.equal(a, b)]
        lines += [f"rank{rank}: auto replays per step {replays}; explain says 'runs collectives': {flagged}",
                  f"rank{rank}: grads differing from plain: {len(bad)} {bad[:4]}"]
    except Exception as e:  # noqa
        lines.append(f"rank{rank}: auto raised {type(e).__name__}: {str(e)[:300]}")
    with open(os.path.join(out, f"r{rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = tempfile.mkdtemp()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(worker, args=(port, out), nprocs=2, join=False, start_method="spawn")
    import time

    deadline = time.time() + 150
    done = False
    errors = []
    while time.time() < deadline:
        try:
            if ctx.join(timeout=2):
                done = True
                break
        except Exception as e:  # a rank died (e.g. its collective timed out)
            errors.append(str(e).strip().splitlines()[-1][:300])
            break
    hung = not done and not errors
    if not done:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    text = ""
    for r in range(2):
        p = os.path.join(out, f"r{r}.txt")
        text += open(p).read() if os.path.exists(p) else f"rank{r}: no output\n"
    print(f"compiled blocks: {COMPILE}; budget: {BUDGET}")
    print(text, end="")
    bad = hung or bool(errors) or "differing from plain: 0" not in text.split("rank1: auto")[-1] or text.count("differing from plain: 0 ") < 2
    for e in errors:
        print("a rank failed:", e)
    if hung:
        print("HANG: a rank did not finish within 150 s (killed)")
    print("BUG" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
