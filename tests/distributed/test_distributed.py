"""DDP, FSDP1, FSDP2 (also over layers compiled in place), tensor parallelism and blocks that
call torch.distributed themselves, over gloo with 2 CPU processes: gradients equal the
plain run's, bitwise."""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import socket
import sys
import tempfile
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODES = ["recompute", "offload", "auto"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(wrap: Callable[[torch.nn.Module], torch.nn.Module], mode: str | None, rank: int) -> list[torch.Tensor]:
    import offrecomp
    from tests import models

    torch.manual_seed(0)
    model = wrap(models.GPT(layers=2, h=32, heads=4, p=0.1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads: list[torch.Tensor] = []
    # auto_tight: a budget near the most frugal plan's (about 100 KiB here), so that
    # planned passes drop and replay
    kw = {"budget": 110_000} if mode == "auto_tight" else {}
    rt = offrecomp.runtime(model, mode=mode and mode.removesuffix("_tight"), min_bytes=0, **kw) if mode else None
    if rt is not None:
        assert len(rt.regions) == 2, rt.regions
        rt.__enter__()
    data = 0 if wrap is _tp else rank  # tensor parallel ranks share the batch
    try:
        for step in range(5):
            torch.manual_seed(100 * step + data)
            # another length per step and per rank (dynamic padding): ranks run other
            # signatures, borrowing the plan of the longest (NOTE [Borrowed plans])
            t = ((16, 12, 16, 16, 14), (16, 14, 16, 16, 12))[data % 2][step]
            idx = torch.randint(0, 64, (2, t), generator=torch.Generator().manual_seed(step * 10 + data))
            model(idx).backward()
            for p in model.parameters():
                g = p.grad
                if g is None:
                    continue  # FSDP1: a parameter with no elements in this rank's shard
                grads.append((g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone())
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        if rt is not None:
            rt.__exit__(None, None, None)
    if rt is not None and mode == "recompute":
        assert all(s.replays == 2 for s in rt.report().steps), [s.replays for s in rt.report().steps]
    if rt is not None and mode == "auto" and wrap is _ddp:
        phases = [s.phase for s in rt.report().steps]
        assert phases == ["measure", "borrowed", "calibrate", "planned", "borrowed"], phases
    if rt is not None and mode in ("auto", "auto_tight") and wrap is _fsdp1:
        # the units gather parameters; the blocks inside them run no collective
        assert all(r.endswith("._fsdp_wrapped_module") for r in rt.regions), rt.regions
        assert "runs collectives" not in rt.explain()
        if mode == "auto_tight":
            planned = [s for s in rt.report().steps if s.phase in ("planned", "borrowed")]
            assert planned and all(s.replays > 0 for s in planned), [(s.phase, s.replays) for s in rt.report().steps]
    if rt is not None and mode == "auto" and wrap in (_tp, _sync):
        # NOTE [Collective regions]: a replay on one rank alone would hang. A DTensor
        # parameter tells before the first pass; a torch.distributed call, once recorded.
        steps = rt.report().steps[0 if wrap is _tp else 1 :]
        assert all(s.replays == 0 and s.recomputed_bytes == 0 for s in steps)
        assert rt.explain().count("runs collectives: never recomputed") == 2
    return grads


def _ddp(m: torch.nn.Module) -> torch.nn.Module:
    return torch.nn.parallel.DistributedDataParallel(m)


def _fsdp2(m: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for blk in m.blocks:
        fully_shard(blk)
    fully_shard(m)
    return m


def _fsdp1(m: torch.nn.Module) -> torch.nn.Module:
    """FSDP1 units around each block (NOTE [FSDP1 units]: the blocks inside are the regions)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({type(m.blocks[0])})
    return FullyShardedDataParallel(m, device_id=torch.device("cpu"), auto_wrap_policy=policy, use_orig_params=True)


def _fsdp2_compiled(m: torch.nn.Module) -> torch.nn.Module:
    """torchtune's order: compile each layer in place, then shard."""
    for blk in m.blocks:
        blk.compile(backend="aot_eager")
    return _fsdp2(m)


def _tp(m: torch.nn.Module) -> torch.nn.Module:
    """Tensor parallel MLPs (DTensor parameters; the recorder must not read their storage)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for blk in m.blocks:
        parallelize_module(blk, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    return m


class _SyncBlock(torch.nn.Module):
    """A block whose forward calls torch.distributed itself (a statistic all-reduced)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        s = y.detach().abs().mean().reshape(1).clone()
        dist.all_reduce(s)
        return y * (1.0 + 0.0 * s)


def _sync(m: torch.nn.Module) -> torch.nn.Module:
    m.blocks = torch.nn.ModuleList(_SyncBlock(b) for b in m.blocks)
    return m


def _sync_compiled(m: torch.nn.Module) -> torch.nn.Module:
    """The same blocks compiled in place: an op recording sees nothing inside them, so
    only the process groups' sequence numbers tell that they run collectives (NOTE
    [Collective regions]); ranks planning alike or not, none replays them alone."""
    m = _sync(m)
    for blk in m.blocks:
        blk.compile(backend="aot_eager")
    return m


WRAPS = {
    "ddp": _ddp, "fsdp1": _fsdp1, "fsdp2": _fsdp2, "fsdp2_compiled": _fsdp2_compiled, "tp": _tp, "sync": _sync,
    "sync_compiled": _sync_compiled,
}
#: Modes per wrapper: every mode for data parallelism; what the case is about otherwise
#: (a replay through the compiled call, auto's treatment of collective regions, and
#: for FSDP1 auto under a budget that makes it drop, so that its blocks replay).
CASES = {
    "ddp": MODES, "fsdp1": [*MODES, "auto_tight"], "fsdp2": MODES, "fsdp2_compiled": ["recompute", "auto"], "tp": MODES,
    "sync": ["auto"], "sync_compiled": ["auto", "auto_tight"],
}


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world))
    faulthandler.enable(all_threads=True)  # a rank that crashes prints every thread's stack
    sys.path.insert(0, os.getcwd())
    torch.set_num_threads(1)
    # a rank replaying a collective alone waits for its peer: a minute, not gloo's half hour
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        results: dict[str, bool] = {}
        for name, wrap in WRAPS.items():
            ref = _train(wrap, None, rank)
            for mode in CASES[name]:
                got = _train(wrap, mode, rank)
                results[f"{name}:{mode}"] = len(ref) == len(got) and all(
                    torch.equal(a, b) for a, b in zip(ref, got)
                )
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()
    # The compiled blocks' graphs hold the process group (dynamo keeps the compiled
    # functions in this module's globals), so it outlives destroy_process_group and would
    # be torn down while the interpreter finalizes, where freeing torch's objects can
    # abort the process ("terminate called without an active exception"). The results
    # are on disk: the rank leaves without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
def test_ddp_fsdp2_and_tp_two_cpu_ranks_match_plain() -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, join=True, start_method="spawn")
        for rank in range(2):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                results = json.load(f)
            expected = {f"{w}:{m}": True for w, modes in CASES.items() for m in modes}
            assert results == expected, (rank, results)


def test_host_limit_is_divided_among_local_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from offrecomp.pool import default_host_limit

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    one = default_host_limit()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    four = default_host_limit()
    assert four <= one // 4 * 1.1  # available memory moves a little between the two reads
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='zero'"):
        default_host_limit()
