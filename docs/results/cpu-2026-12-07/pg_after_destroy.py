"""Does a process group outlive destroy_process_group when a compiled block called a
collective? Two gloo ranks run the distributed test's sync_compiled case (auto, tight
budget), destroy the process group, reset dynamo, collect, and count the process groups
still reachable from Python (through the compiled graphs' fake script objects)."""

import gc
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch
import torch.multiprocessing as mp

from tests.distributed import test_distributed as t


def _rank(rank: int, world: int, port: int, out: str) -> None:
    t.WRAPS = {"sync_compiled": t._sync_compiled}
    t.CASES = {"sync_compiled": ["auto_tight"]}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    for mode in (None, "auto_tight"):
        t._train(t._sync_compiled, mode, rank)
    torch.distributed.destroy_process_group()
    torch._dynamo.reset()
    gc.collect()
    alive = [
        type(o.real_obj).__name__ for o in gc.get_objects()
        if type(o).__name__ == "FakeScriptObject" and getattr(o, "real_obj", None) is not None
    ]
    print(f"rank {rank}: after destroy_process_group, dynamo reset and gc: {alive}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(2, t._free_port(), out), nprocs=2, join=True, start_method="spawn")
