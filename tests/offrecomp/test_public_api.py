"""The public surface, frozen: a change shows up in review."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from torch import nn

import offrecomp


def test_public_names() -> None:
    assert sorted(offrecomp.__all__) == sorted([
        "runtime", "Runtime", "Config", "ENV_VARS", "MODES", "Placement", "Plan", "ROOT",
        "Report", "StepRecord", "in_replay", "ReplayDivergedError", "ReplayMismatchError",
        "__version__",
    ])
    for name in offrecomp.__all__:
        assert hasattr(offrecomp, name), name


def test_the_reports_config_is_json_data() -> None:
    """``report().to_json()``'s config holds JSON's own types: a flag a bool, a count a
    number, an unset value null; sizes in bytes, shares as they read, types and functions as
    their repr."""

    def pick(module: nn.Module, name: str) -> bool:
        return isinstance(module, nn.Linear)

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    config = json.loads(offrecomp.runtime(model, budget="4MiB", regions=pick).report().to_json())["config"]
    assert config["disable"] is False and config["native_keep"] is True
    assert config["min_bytes"] == 65536 and config["drift"] == 0.25 and config["plan_cache_size"] == 8
    assert config["max_overhead"] is None and config["log_level"] is None and config["mode"] == "auto"
    assert config["budget"] == 4 << 20 and config["prefetch"] == "2 regions"
    assert config["regions"] == repr(pick)
    listed = offrecomp.runtime(model, regions=(nn.Linear,)).report().to_json()
    assert json.loads(listed)["config"]["regions"] == [repr(nn.Linear)]


def test_import_does_not_touch_cuda() -> None:
    """Invariant 6: importing offrecomp initialises no CUDA, creates no stream, pins nothing."""
    code = textwrap.dedent(
        """
        import torch
        def boom(*a, **k):
            raise SystemExit("CUDA touched at import: " + repr(a))
        torch.cuda._lazy_init = boom
        torch.cuda.init = boom
        torch.cuda.Stream = boom
        torch.cuda.current_stream = boom
        torch.cuda.Event = boom
        real_empty = torch.empty
        def empty(*a, **k):
            if k.get("pin_memory"):
                boom("pin_memory")
            return real_empty(*a, **k)
        torch.empty = empty
        import offrecomp, offrecomp.offload, offrecomp.backends, offrecomp.pool, scheduler
        import offrecomp.context, offrecomp.hooks, offrecomp.trace, offrecomp.planning
        assert not torch.cuda.is_initialized()
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr + out.stdout


def test_scheduler_never_imports_torch() -> None:
    code = "import sys, scheduler, scheduler.solver, scheduler.simulate, scheduler.cost_model; " \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
