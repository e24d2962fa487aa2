"""DeepSpeed ZeRO-3 on two CPU ranks (gloo): its hooks gather each module's parameters
for every forward, a replay's included, and free them after (``param.data =
torch.empty(0)``). Under every mode the losses and the trained parameters are plain's,
bitwise, and no region holds a gathered parameter past the forward (NOTE [Parameters
released by their owner])."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import weakref
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tests import models

pytest.importorskip("deepspeed", reason="deepspeed is an optional extra (pip install -e '.[deepspeed]')")

MODES = [None, "recompute", "auto", "offload", "keep"]
STEPS = 6


def _train(mode: str | None, rank: int) -> dict[str, Any]:
    import deepspeed

    import offrecomp

    config = {
        "train_batch_size": 2,
        "zero_optimization": {
            "stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
            "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0,  # free each module's after its forward
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = models.HeadedStack()
    engine, *_ = deepspeed.initialize(model=model, config=config)
    gathered: list[weakref.ref[torch.UntypedStorage]] = []

    def note(module: nn.Module, args: Any) -> None:  # runs after DeepSpeed's own pre-hook
        gathered.extend(weakref.ref(p.untyped_storage()) for p in module.parameters(recurse=False) if p.numel())

    for m in engine.module.modules():
        m.register_forward_pre_hook(note)
    losses, alive = [], []
    rt = offrecomp.runtime(engine.module, mode=mode, budget=1 << 16) if mode is not None else None
    if rt is not None:
        rt.__enter__()
    try:
        for step in range(STEPS):
            x = torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(10 * step + rank))
            gathered.clear()
            loss = engine(x)
            alive.append(sum(r() is not None for r in gathered))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    finally:
        if rt is not None:
            rt.__exit__(None, None, None)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        params = [p.detach().flatten().tolist() for p in engine.module.parameters()]
    return {"losses": losses, "alive": alive, "params": params}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(
        DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
    )
    sys.path.insert(0, os.getcwd())
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = {str(mode): _train(mode, rank) for mode in MODES}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


@pytest.mark.slow
def test_zero3_partitioned_parameters_train_as_plain_and_are_not_held() -> None:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, join=True, start_method="spawn")
        for rank in range(2):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                results = json.load(f)
            plain = results["None"]
            assert plain["alive"] == [0] * STEPS  # DeepSpeed's linear saves the weight itself
            for mode in MODES[1:]:
                got = results[str(mode)]
                assert got["losses"] == plain["losses"], (rank, mode)
                assert got["params"] == plain["params"], (rank, mode)
                # the first pass holds the last block's until its backward begins
                assert got["alive"][0] <= 7 and got["alive"][1:] == [0] * (STEPS - 1), (rank, mode, got["alive"])
