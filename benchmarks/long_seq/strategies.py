"""The memory strategies compared by the benchmark.

A :class:`Strategy` says whether it can run here (:meth:`Strategy.available`) and, for one
model and one sequence length, prepares a :class:`Runner`. The harness brackets every
visit to a runner with :meth:`Runner.enter` / :meth:`Runner.exit`; between them it runs
whole training steps (``forward`` under autocast, ``backward``, optimizer step). A runner
is built once per (strategy, sequence length) and reused for all of its visits, so a
stateful strategy (offrecomp learns in its first step and plans from the second, a
compiled model keeps its graphs) keeps what it learned from one visit to the next.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .models import GPT, blocks_of

__all__ = [
    "ALL_STRATEGIES",
    "NO_LINK_GBPS",
    "ON_REQUEST",
    "NotApplicable",
    "Options",
    "PrepareContext",
    "Runner",
    "Strategy",
    "activation_budget",
    "get_strategies",
    "offrecomp_importable",
]


class NotApplicable(Exception):
    """Raised by :meth:`Strategy.prepare` when the strategy cannot apply to this model."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """What the command line says about optional strategies."""

    with_compile: bool = False
    """Run ``compile_budget`` (torch.compile); off by default on CPU."""
    compile_budget: float = 0.5
    """``torch._functorch.config.activation_memory_budget`` for ``compile_budget``."""
    compile_backend: str = "inductor"
    """``torch.compile`` backend; ``aot_eager_decomp_partition`` runs the same min-cut
    partitioner without generating code (fast, for tests)."""
    compile_dynamic: bool = False
    """Compile with ``dynamic=True`` (one graph for every sequence length) rather than
    torch's default (a static graph first, a dynamic one once a second length is seen)."""
    step_budget_bytes: int | None = None
    """The step-memory budget (``--mem-budget``) that ``offrecomp_auto@budget`` is given,
    less the gradients' bytes; None leaves that strategy unavailable."""


@dataclass(frozen=True, kw_only=True)
class PrepareContext:
    """What a strategy may need to know to prepare a runner."""

    device: torch.device
    seq: int
    plain_saved_bytes: int | None
    """Bytes autograd saves in a plain forward at this shape (for fractional budgets)."""


class Runner:
    """One strategy applied to one model for one input shape. Subclasses override hooks."""

    warmup_floor: int = 0
    """Fewest warm-up steps this runner needs before a step is representative."""
    search_floor: int | None = None
    """Steps before the last of a longest-sequence probe (None: ``warmup_floor``); a
    probe takes the highest step peak of these steps and one more."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def enter(self) -> None:
        """Install whatever the strategy needs (hooks, wrappers) for the steps that follow."""

    def exit(self) -> None:
        """Undo :meth:`enter`; the model must behave as plain afterwards."""

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(idx, targets)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def close(self) -> None:
        """Release everything the runner holds; called once after its last visit."""

    def last_step_phase(self) -> str | None:
        """What the strategy did in its latest step, if it has phases (offrecomp)."""
        return None

    def extras(self) -> dict[str, Any]:
        """Strategy-specific measurements (link bandwidth, reports) for the JSON output."""
        return {}


class Strategy:
    """A named way of handling activations. Subclasses set ``name`` and ``summary``."""

    name: str = ""
    summary: str = ""
    needs_plain_bytes: bool = False
    """Whether :meth:`prepare` needs ``PrepareContext.plain_saved_bytes``."""

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()

    def available(self, device: torch.device) -> tuple[bool, str]:
        return True, ""

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        return Runner(model)


# ---------------------------------------------------------------------------------------
# plain and torch.utils.checkpoint


class NoCheckpoint(Strategy):
    name = "none"
    summary = "plain training, every activation kept"


class _PatchedBlocksRunner(Runner):
    """Wraps every block's ``forward`` in a non-reentrant checkpoint while entered."""

    def __init__(self, model: nn.Module, **checkpoint_kwargs: Any) -> None:
        super().__init__(model)
        self._kwargs = checkpoint_kwargs

    def enter(self) -> None:
        from torch.utils.checkpoint import checkpoint

        for block in blocks_of(self.model):
            # An instance attribute shadows the class's forward; exit() deletes it again.
            block.forward = functools.partial(  # type: ignore[method-assign]
                checkpoint, block.forward, use_reentrant=False, **self._kwargs
            )

    def exit(self) -> None:
        for block in blocks_of(self.model):
            if "forward" in vars(block):
                del block.forward


class CheckpointBlock(Strategy):
    name = "ckpt_block"
    summary = "torch.utils.checkpoint around every block (use_reentrant=False)"

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        return _PatchedBlocksRunner(model)


class _SequentialRunner(Runner):
    def __init__(self, model: GPT, segments: int) -> None:
        super().__init__(model)
        self.segments = segments

    def enter(self) -> None:
        from torch.utils.checkpoint import checkpoint_sequential

        def run(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
            return checkpoint_sequential(blocks, self.segments, x, use_reentrant=False)

        self.model.run_blocks = run  # type: ignore[assignment]

    def exit(self) -> None:
        self.model.run_blocks = None  # type: ignore[assignment]


class CheckpointSqrt(Strategy):
    name = "ckpt_sqrt"
    summary = "checkpoint_sequential over the blocks with ~sqrt(N) segments"

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        if not isinstance(model, GPT):
            raise NotApplicable("n/a: checkpoint_sequential needs the GPT model's block loop")
        segments = max(1, round(math.sqrt(len(model.blocks))))
        return _SequentialRunner(model, segments)


def _sac_saved_ops() -> set[Any]:
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


class SelectiveMatmul(Strategy):
    name = "sac_matmul"
    summary = "selective AC per block: save mm/addmm/bmm and attention outputs, recompute the rest"

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        saved = _sac_saved_ops()

        def policy(_ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            if op in saved:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
        return _PatchedBlocksRunner(model, context_fn=context_fn)


# ---------------------------------------------------------------------------------------
# offload peers


class _ForwardContextRunner(Runner):
    """Runs each forward inside a context manager made by ``make_ctx``."""

    def __init__(self, model: nn.Module, make_ctx: Callable[[], Any]) -> None:
        super().__init__(model)
        self._make_ctx = make_ctx

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self._make_ctx():
            return self.model(idx, targets)


class SaveOnCpu(Strategy):
    name = "save_on_cpu"
    summary = "torch.autograd.graph.save_on_cpu(pin_memory=True): every saved tensor to host"

    def available(self, device: torch.device) -> tuple[bool, str]:
        if device.type != "cuda":
            return False, "n/a: needs a GPU"
        return True, ""

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        return _ForwardContextRunner(
            model, lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
        )


class TorchtuneOffload(Strategy):
    name = "torchtune_offload"
    summary = "torchtune OffloadActivations (side-stream offload of every saved tensor)"

    def available(self, device: torch.device) -> tuple[bool, str]:
        if importlib.util.find_spec("torchtune") is None:
            return False, "n/a: pip install offrecomp[torchtune]"
        if device.type != "cuda":
            return False, "n/a: needs a GPU"
        return True, ""

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        from torchtune.training import OffloadActivations

        offload = OffloadActivations()
        return _ForwardContextRunner(model, lambda: offload)


# ---------------------------------------------------------------------------------------
# torch.compile with an activation memory budget


class _CompiledRunner(Runner):
    warmup_floor = 1  # the first call compiles

    def __init__(self, model: nn.Module, compiled: Callable[..., Any], budget: float) -> None:
        super().__init__(model)
        self._compiled = compiled
        self._budget = budget

    @contextlib.contextmanager
    def _budget_ctx(self) -> Iterator[None]:
        # Private knob (torch._functorch.config): read by the min-cut partitioner when the
        # graph is compiled, so it is patched around the calls that may compile.
        import torch._functorch.config as functorch_config

        with functorch_config.patch(activation_memory_budget=self._budget):
            yield

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self._budget_ctx():
            return self._compiled(idx, targets)

    def backward(self, loss: torch.Tensor) -> None:
        with self._budget_ctx():
            loss.backward()


class CompileBudget(Strategy):
    name = "compile_budget"
    summary = "torch.compile with activation_memory_budget (min-cut recompute)"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._compiled: dict[int, Callable[..., Any]] = {}

    def available(self, device: torch.device) -> tuple[bool, str]:
        if not self.options.with_compile:
            return False, "skipped: pass --with-compile (slow on CPU, needs a C++ compiler)"
        return True, ""

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        key = id(model)
        if key not in self._compiled:
            if ctx.device.type == "cpu":
                # Inductor's pool of compile workers keeps warming up in the background
                # after the first compile, which on a small CPU slows every strategy timed
                # next to it; compiling in-process keeps the timings independent.
                import torch._inductor.config as inductor_config

                inductor_config.compile_threads = 1
            self._compiled[key] = torch.compile(
                model,
                backend=self.options.compile_backend,
                dynamic=True if self.options.compile_dynamic else None,
            )
        return _CompiledRunner(model, self._compiled[key], self.options.compile_budget)


# ---------------------------------------------------------------------------------------
# offrecomp


def offrecomp_importable() -> tuple[bool, str]:
    """Whether ``offrecomp.runtime`` can be called here."""
    try:
        offrecomp = importlib.import_module("offrecomp")
    except Exception as exc:
        return False, f"offrecomp runtime not importable ({type(exc).__name__}: {exc})"
    if not callable(getattr(offrecomp, "runtime", None)):
        return False, "offrecomp runtime not importable"
    return True, ""


def _median_of(records: list[Any], field: str) -> float | None:
    values = []
    for rec in records:
        value = rec.get(field) if isinstance(rec, dict) else getattr(rec, field, None)
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            values.append(float(value))
    return statistics.median(values) if values else None


def _jsonable(obj: Any) -> Any:
    """A report as JSON data: ``to_json()`` output parsed when it is a string."""
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        out = to_json()
        if isinstance(out, str):
            try:
                return json.loads(out)
            except json.JSONDecodeError:
                return [json.loads(line) for line in out.splitlines() if line.strip()]
        return out
    return repr(obj)


class _OffrecompRunner(Runner):
    warmup_floor = 3  # step 1 measures, step 2 calibrates (both recompute everything), 3 plans
    # A probe needs the plan's memory, not its settled speed: the offload trial's later
    # plans are solved for the same budget (NOTE [Offload trial]), so the probe stops
    # after two planned steps rather than the trial's 2 * TRIAL_PASSES more.
    search_floor = 3

    def __init__(self, model: nn.Module, **runtime_kwargs: Any) -> None:
        super().__init__(model)
        import offrecomp

        self.runtime_kwargs = runtime_kwargs
        self.rt = offrecomp.runtime(model, **runtime_kwargs)
        self._entered = False
        on_gpu = any(p.is_cuda for p in model.parameters())
        if runtime_kwargs.get("mode") == "auto" and on_gpu:
            from offrecomp.planning import TRIAL_PASSES

            # NOTE [Offload trial]: a plan that offloads may be tried against one that
            # does not, TRIAL_PASSES planned steps each, before the plan settles
            self.warmup_floor = 3 + 2 * TRIAL_PASSES

    def enter(self) -> None:
        self.rt.__enter__()
        self._entered = True

    def exit(self) -> None:
        if self._entered:
            self._entered = False
            self.rt.__exit__(None, None, None)

    def last_step_phase(self) -> str | None:
        steps = self._steps()
        if not steps:
            return None
        return str(getattr(steps[-1], "phase", "")) or None

    def _steps(self) -> list[Any]:
        try:
            return list(self.rt.report().steps)
        except Exception:
            return []

    def extras(self) -> dict[str, Any]:
        # A signature's first step measures (recompute everything); figures come from the
        # steps after it, which ran the plan (or the forced mode).
        steps = self._steps()
        phases = [getattr(s, "phase", "") for s in steps]
        planned = [s for s, phase in zip(steps, phases) if phase != "measure"] or steps
        out: dict[str, Any] = {
            "runtime_kwargs": dict(self.runtime_kwargs),
            "phases": phases,
            "d2h_gbps": _median_of(planned, "d2h_gbps"),
            "h2d_gbps": _median_of(planned, "h2d_gbps"),
        }
        for field in (
            "peak_activation_bytes",
            "device_peak_bytes",
            "kept_bytes",
            "offloaded_bytes",
            "recomputed_bytes",
            "recompute_seconds",
            "stall_seconds",
        ):
            value = _median_of(planned, field)
            if value is not None:
                out[f"median_{field}"] = value
        try:
            out["report"] = _jsonable(self.rt.report())
        except Exception as exc:
            out["report_error"] = f"{type(exc).__name__}: {exc}"
        try:  # the last plan's placements per region call, with predicted times
            out["explain"] = self.rt.explain()
        except Exception as exc:
            out["explain_error"] = f"{type(exc).__name__}: {exc}"
        return out


#: The link figure (GB/s, the least the runtime accepts) that leaves a planner no offload
#: worth making: ``offload=False`` plans keep and recompute only, at the same budget.
NO_LINK_GBPS = 1e-6


class Offrecomp(Strategy):
    """An offrecomp mode; ``budget_fraction`` is a share of the plain run's saved bytes.

    ``step_budget=True`` (``offrecomp_auto@budget``) gives the runtime the step-memory
    budget of ``--mem-budget`` instead (NOTE [Step budget for auto]). ``offload=False``
    (``offrecomp_auto_no_offload@50%``) tells the planner the link moves nothing, so its
    plans keep and recompute only: the best plan without offloading at that budget, the
    figure an offloading plan has to beat.
    """

    def __init__(
        self,
        mode: str,
        budget_fraction: float | None = None,
        options: Options | None = None,
        *,
        step_budget: bool = False,
        offload: bool = True,
    ) -> None:
        super().__init__(options)
        self.mode = mode
        self.budget_fraction = budget_fraction
        self.step_budget = step_budget
        self.offload = offload
        self.needs_plain_bytes = budget_fraction is not None
        if not offload:
            pct = f"{(budget_fraction or 0) * 100:g}%"
            self.name = f"offrecomp_{mode}_no_offload@{pct}"
            self.summary = (
                f"offrecomp.runtime(mode={mode!r}, budget={pct} of plain saved bytes), its "
                "planner told the link moves nothing: keep and recompute only"
            )
        elif step_budget:
            self.name = f"offrecomp_{mode}@budget"
            self.summary = (
                f"offrecomp.runtime(mode={mode!r}, budget=--mem-budget less the gradients)"
            )
        elif budget_fraction is None:
            self.name = f"offrecomp_{mode}"
            self.summary = f"offrecomp.runtime(mode={mode!r})"
        else:
            pct = f"{budget_fraction * 100:g}%"
            self.name = f"offrecomp_{mode}@{pct}"
            self.summary = f"offrecomp.runtime(mode={mode!r}, budget={pct} of plain saved bytes)"

    def available(self, device: torch.device) -> tuple[bool, str]:
        if self.step_budget and self.options.step_budget_bytes is None:
            return False, "n/a: needs --mem-budget (its budget is the search's)"
        return offrecomp_importable()

    def prepare(self, model: nn.Module, ctx: PrepareContext) -> Runner:
        kwargs: dict[str, Any] = {"mode": self.mode}
        if self.step_budget:
            kwargs["budget"] = activation_budget(model, self.options.step_budget_bytes or 0)
        elif self.budget_fraction is not None:
            if not ctx.plain_saved_bytes:
                raise RuntimeError("the plain run's saved bytes are unknown at this shape")
            kwargs["budget"] = int(self.budget_fraction * ctx.plain_saved_bytes)
        if not self.offload:
            kwargs["d2h_gbps"] = kwargs["h2d_gbps"] = NO_LINK_GBPS
        return _OffrecompRunner(model, **kwargs)


# NOTE [Step budget for auto]
# The search's budget bounds the step's allocator peak above the resting weights and
# optimizer state: activations, gradients and the optimizer's transients. The runtime's
# budget bounds activations only. So ``offrecomp_auto@budget`` gets the search's figure
# less one gradient per trainable parameter, which the step peak also holds at the end
# of backward; what remains (the optimizer's transients, the allocator's rounding) is
# what the planner's own margin must absorb.


def activation_budget(model: nn.Module, step_budget_bytes: int) -> int:
    """The runtime budget matching a step-memory budget: ``step_budget_bytes`` less the
    gradients' bytes. Raises :class:`NotApplicable` when nothing is left."""
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    left = step_budget_bytes - grads
    if left <= 0:
        raise NotApplicable(
            f"n/a: the step budget ({step_budget_bytes} B) does not cover the gradients ({grads} B)"
        )
    return left


def _all(options: Options | None = None) -> list[Strategy]:
    o = options or Options()
    return [
        NoCheckpoint(o),
        CheckpointBlock(o),
        CheckpointSqrt(o),
        SelectiveMatmul(o),
        SaveOnCpu(o),
        CompileBudget(o),
        TorchtuneOffload(o),
        Offrecomp("keep", options=o),
        Offrecomp("recompute", options=o),
        Offrecomp("offload", options=o),
        Offrecomp("auto", 0.5, options=o),
        Offrecomp("auto", 0.25, options=o),
        Offrecomp("auto", 0.5, options=o, offload=False),
        Offrecomp("auto", 0.25, options=o, offload=False),
        Offrecomp("auto", options=o, step_budget=True),
    ]


ALL_STRATEGIES: tuple[str, ...] = tuple(s.name for s in _all())
#: Comparisons run only when named: the baselines an offloading plan is read against.
ON_REQUEST: frozenset[str] = frozenset(
    s.name for s in _all() if isinstance(s, Offrecomp) and not s.offload
)


def get_strategies(
    names: list[str] | None = None, options: Options | None = None
) -> list[Strategy]:
    """Fresh strategy objects by name, in the order given (when ``None``, all of them but
    those in ``ON_REQUEST``).

    ``none`` is always included (first) since every ratio is taken against it.
    """
    table = {s.name: s for s in _all(options)}
    if names is None:
        return [s for name, s in table.items() if name not in ON_REQUEST]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(
            f"unknown strategies {', '.join(unknown)}; accepted: {', '.join(ALL_STRATEGIES)}"
        )
    ordered = ["none", *[n for n in dict.fromkeys(names) if n != "none"]]
    return [table[n] for n in ordered]
