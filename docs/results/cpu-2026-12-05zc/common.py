"""Shared helpers for the trainer-integration sweeps (sweep_hf.py, sweep_lightning.py,
sweep_accelerate.py). Not run on its own.

A *run* returns a dict: grads (list, one dict name->tensor per optimizer step, captured
just before the optimizer steps), params, buffers (name->tensor after training), losses
(list of floats / tensors logged by the trainer), extra (anything case-specific), report
(the offrecomp StepRecords, or None for a plain run), leftover signature (hooks and
instance `forward`s on the model after training, the saved-tensor hook stack).

A *case* is run plainly twice (determinism check), then under keep, recompute, offload
and auto (budget = half of keep's highest peak_activation_bytes), all with min_bytes=0 so
that a tiny model's saves are placed at all. Verdicts: bitwise equality of everything
against the first plain run, no error (or the same error as plain), no leftovers
relative to the plain run, sane books.
"""
from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: its offrecomp

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

from offrecomp import _torch_compat as tc  # noqa: E402

MODES = ("keep", "recompute", "offload", "auto")


def global_hooks() -> dict[str, int]:
    import torch.nn.modules.module as M
    import torch.optim.optimizer as O

    out = {}
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_buffer_registration_hooks",
                 "_global_module_registration_hooks", "_global_parameter_registration_hooks"):
        out[name] = len(getattr(M, name, {}))
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        out[name] = len(getattr(O, name, {}))
    return out


def leftover_signature(model: torch.nn.Module) -> dict[str, Any]:
    """What is installed on the model and process after training."""
    mods = {}
    for name, m in model.named_modules():
        d = m.__dict__
        entry = (
            "forward" in d,
            len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
            len(getattr(m, "_backward_pre_hooks", {})),
            tuple(sorted(k for k in d if "offrecomp" in k.lower())),
            tuple(sorted(k for k in d if k.startswith("_compiled_call") or k == "_compiled_call_impl" and d[k] is not None)),
        )
        mods[name] = entry
    return {
        "saved_tensor_hooks_top": tc.top_saved_tensors_hooks() is not None,
        "modules": mods,
        "global": global_hooks(),
        "grad_enabled": torch.is_grad_enabled(),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
    }


def diff_leftovers(plain: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = []
    if got["saved_tensor_hooks_top"]:
        out.append("saved-tensor hooks left on the thread's stack")
    for k in ("global", "grad_enabled", "autocast_cpu"):
        if plain[k] != got[k]:
            out.append(f"{k}: plain {plain[k]} vs {got[k]}")
    for name, entry in got["modules"].items():
        ref = plain["modules"].get(name)
        if ref != entry:
            out.append(f"module {name or '<root>'}: plain {ref} vs {entry}")
    for name in plain["modules"]:
        if name not in got["modules"]:
            out.append(f"module {name} missing")
    return out[:6]


def _eq(a: Any, b: Any, path: str, out: list[str]) -> None:
    if len(out) >= 6:
        return
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            out.append(f"{path}: type {type(a).__name__} vs {type(b).__name__}")
        elif a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{path}: shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
        elif not torch.equal(a, b):
            d = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else float("nan")
            out.append(f"{path}: differs (max abs diff {d:.3g})")
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            out.append(f"{path}: keys differ {sorted(set(a) ^ set(b))[:5]}")
        for k in a:
            if k in b:
                _eq(a[k], b[k], f"{path}.{k}", out)
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _eq(x, y, f"{path}[{i}]", out)
        return
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return
    if a != b:
        out.append(f"{path}: {a!r} vs {b!r}")


def compare(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("error", "grads", "params", "buffers", "losses", "extra"):
        _eq(ref.get(key), got.get(key), key, out)
    return out


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def state_of(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return ({n: p.detach().clone() for n, p in model.named_parameters()},
            {n: b.detach().clone() for n, b in model.named_buffers()})


def books_check(steps: list[Any], mode: str, *, expect_steps: int | None, expect_passes: list[int] | None,
                budget: int | None) -> list[str]:
    """Sanity of the report's step records."""
    out = []
    if expect_steps is not None and len(steps) != expect_steps:
        out.append(f"{len(steps)} step records, expected {expect_steps}")
    # step numbers restart at 0 for each runtime (callback); each run must count up by one
    nums = [s.step for s in steps]
    if any(b != a + 1 and b != 0 for a, b in zip(nums, nums[1:])) or (nums and nums[0] != 0):
        out.append(f"step numbers {nums}")
    if expect_passes is not None and [s.passes for s in steps] != expect_passes[: len(steps)] and len(steps) == len(expect_passes):
        out.append(f"passes {[s.passes for s in steps]}, expected {expect_passes}")
    for s in steps:
        if s.peak_activation_bytes <= 0:
            out.append(f"step {s.step}: peak_activation_bytes {s.peak_activation_bytes}")
            break
    if mode == "keep" and any(s.recomputed_bytes or s.offloaded_bytes or s.replays for s in steps):
        out.append("keep mode recomputed/offloaded something")
    if mode == "recompute" and not all(s.recomputed_bytes > 0 and s.replays > 0 for s in steps):
        out.append(f"recompute mode: steps without recompute {[(s.step, s.recomputed_bytes, s.replays) for s in steps if not (s.recomputed_bytes > 0 and s.replays > 0)]}")
    if mode == "offload" and not all(s.offloaded_bytes > 0 for s in steps):
        out.append(f"offload mode: steps without offload {[(s.step, s.offloaded_bytes) for s in steps if not s.offloaded_bytes]}")
    if mode == "auto" and budget:
        over = [(s.step, s.phases or s.phase, s.peak_activation_bytes) for s in steps
                if (s.phase in ("planned", "borrowed")) and s.peak_activation_bytes > 1.05 * budget]
        if over:
            out.append(f"auto planned steps over budget {budget}: {over}")
    return out


def summarize_steps(steps: list[Any]) -> str:
    return " ".join(f"{s.step}:{s.phases or s.phase}/p{s.passes}/pk{s.peak_activation_bytes}/rc{s.recomputed_bytes}/of{s.offloaded_bytes}/rp{s.replays}"
                    for s in steps)


def run_case(name: str, fn: Callable[..., dict[str, Any]], *, modes: tuple[str, ...] = MODES,
             out: Any = sys.stdout, auto_budget_factor: float = 0.5, books: bool = True,
             plain_leftover_ok: bool = False, expect_error: bool = False) -> dict[str, str]:
    """fn(mode_kwargs or None) -> run dict. Returns {mode: 'PASS'|'FAIL: ...'}."""
    verdicts: dict[str, str] = {}

    def call(kw: dict[str, Any] | None) -> dict[str, Any]:
        gc.collect()
        t0 = time.time()
        try:
            r = fn(kw)
        except BaseException as exc:  # noqa: BLE001
            r = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "tb": traceback.format_exc()[-1500:],
                 "leftover": None, "report": None}
        r["seconds"] = time.time() - t0
        return r

    p1 = call(None)
    p2 = call(None)
    det = compare(p1, p2)
    print(f"\n=== {name}: plain {p1['seconds']:.1f}s error={p1.get('error')}", file=out)
    if det:
        print(f"  plain not deterministic: {det}", file=out)
        verdicts["plain"] = "NONDET"
        return verdicts
    if p1.get("error"):
        print(p1.get("tb", ""), file=out)
        if not expect_error:
            print("  plain run failed unexpectedly: case INVALID", file=out)
            verdicts["plain"] = "INVALID"
            return verdicts
    if p1.get("info"):
        print(f"  plain info: {p1['info']}", file=out)
    keep_peak = None
    for mode in modes:
        kw: dict[str, Any] = {"mode": mode, "min_bytes": 0}
        budget = None
        if mode == "auto":
            if keep_peak:
                budget = int(keep_peak * auto_budget_factor)
                kw["budget"] = budget
        r = call(kw)
        problems = compare(p1, r)
        if r.get("error") and not p1.get("error"):
            problems.insert(0, f"ERROR {r['error']}")
        if r.get("leftover") is not None and p1.get("leftover") is not None:
            problems += [f"LEFTOVER {x}" for x in diff_leftovers(p1["leftover"], r["leftover"])]
        elif r.get("leftover") is None and not r.get("error"):
            problems.append("no leftover signature collected")
        problems += [f"NOTE {x}" for x in (r.get("notes") or [])]
        steps = r.get("report") or []
        if mode == "keep" and steps:
            keep_peak = max(s.peak_activation_bytes for s in steps)
        if books and r.get("report") is not None:
            problems += [f"BOOKS {x}" for x in books_check(steps, mode, expect_steps=r.get("expect_steps"),
                                                           expect_passes=r.get("expect_passes"), budget=budget)]
        elif books and not r.get("error"):
            problems.append("BOOKS no report")
        verdict = "PASS" if not problems else "FAIL: " + " | ".join(problems)
        verdicts[mode] = verdict
        print(f"  [{mode}{'' if budget is None else f' budget={budget}'}] {r['seconds']:.1f}s {verdict}", file=out)
        if steps:
            print(f"    steps: {summarize_steps(steps)}", file=out)
        if r.get("info"):
            print(f"    info: {r['info']}", file=out)
        if r.get("notes"):
            print(f"    notes: {r['notes']}", file=out)
        if r.get("error") and r.get("tb") and r.get("error") != p1.get("error"):
            print("    " + r["tb"].replace("\n", "\n    "), file=out)
        out.flush()
    return verdicts
