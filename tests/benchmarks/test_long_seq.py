"""Smoke tests of the long-sequence benchmark: every strategy, the CLI, the search."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from benchmarks.long_seq import main
from benchmarks.long_seq.measure import (
    BenchConfig,
    count_saved_bytes,
    longest_fitting,
    run_benchmark,
)
from benchmarks.long_seq.models import ModelSpec, build_model, hf_available, make_batch
from benchmarks.long_seq.strategies import (
    ALL_STRATEGIES,
    NO_LINK_GBPS,
    ON_REQUEST,
    CompileBudget,
    NotApplicable,
    Options,
    PrepareContext,
    Runner,
    Strategy,
    activation_budget,
    get_strategies,
)
from scheduler import Placement, Plan, Profile, gpt_profile, simulate, solve
from tests.benchmarks.refused import refused, started

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
TINY = ModelSpec(n_layers=4, hidden=32, n_heads=2, vocab=64, max_seq=64, dropout=0.1, seed=3)
SEQ, BATCH = 32, 2
# The fast compile backend runs AOTAutograd's min-cut partitioner (where the activation
# budget acts) without Inductor's C++ code generation, which takes ~45 s cold on 2 cores.
OPTIONS = Options(with_compile=True, compile_backend="aot_eager_decomp_partition")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # The models here are tiny: a second OpenMP thread only adds synchronisation, and on a
    # busy 2-core machine it lets other programs stall every op.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


#: Steps of the gradient comparison: offrecomp auto measures, calibrates, then plans
#: (``_OffrecompRunner.warmup_floor``), so two planned steps.
GRAD_STEPS = 5


def _plain_saved(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> int:
    return count_saved_bytes(model, batch, lambda: torch.autocast("cpu", enabled=False))


def _grads(
    strategy_name: str, spec: ModelSpec, steps: int = GRAD_STEPS, phases: list[str] | None = None
) -> list[list[torch.Tensor]]:
    """Gradients of ``steps`` successive steps (no optimizer update) under one strategy;
    an offrecomp runner's step phases appended to ``phases``."""
    model = build_model(spec, CPU)
    batch = make_batch(spec, BATCH, SEQ, CPU)
    options = OPTIONS
    if strategy_name == "offrecomp_auto@budget":  # the search's step budget: gradients and half the saves
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        options = Options(**{**vars(OPTIONS), "step_budget_bytes": grad_bytes + _plain_saved(model, batch) // 2})
    (strategy,) = [s for s in get_strategies([strategy_name], options) if s.name == strategy_name]
    ok, why = strategy.available(CPU)
    if not ok:
        pytest.skip(f"{strategy_name}: {why}")
    plain = None
    if strategy.needs_plain_bytes:
        plain = _plain_saved(model, batch)
    try:
        runner = strategy.prepare(
            model, PrepareContext(device=CPU, seq=SEQ, plain_saved_bytes=plain)
        )
    except NotApplicable as exc:
        pytest.skip(str(exc))
    out = []
    try:
        for step in range(steps):
            runner.enter()
            try:
                torch.manual_seed(1000 + step)  # same dropout masks in every strategy
                loss = runner.forward(*batch)
                runner.backward(loss)
            finally:
                runner.exit()
            grads = []
            for name, p in model.named_parameters():
                assert p.grad is not None, f"{strategy_name}: no gradient for {name}"
                grads.append(p.grad.detach().clone())
            out.append(grads)
            model.zero_grad(set_to_none=True)
        if phases is not None and hasattr(runner, "rt"):
            phases.extend(s.phase.value for s in runner.rt.report().steps)
    finally:
        runner.close()
    return out


@pytest.fixture(scope="module")
def plain_grads() -> list[list[torch.Tensor]]:
    return _grads("none", TINY)


@pytest.mark.parametrize("name", [n for n in ALL_STRATEGIES if n not in ("none", "compile_budget")])
def test_strategy_gradients_equal_plain(name: str, plain_grads: list[list[torch.Tensor]]) -> None:
    # fp32 on CPU with dropout: recompute restores the RNG state, so gradients are bitwise
    # equal to the plain run's, step after step (offrecomp auto plans from its third step:
    # its last steps run the plan).
    phases: list[str] = []
    got = _grads(name, TINY, phases=phases)
    assert len(got) == len(plain_grads) == GRAD_STEPS
    for step, (ref, res) in enumerate(zip(plain_grads, got)):
        for i, (a, b) in enumerate(zip(ref, res)):
            assert torch.equal(a, b), f"{name}: step {step}, parameter {i} differs"
    if name.startswith("offrecomp_auto"):
        # (a host pause may send a step back to calibrate: NOTE [Host pauses])
        assert len(phases) == GRAD_STEPS and phases[0] == "measure", phases
        assert phases[-1] in ("planned", "borrowed"), phases


def test_compile_budget_gradients_close_to_plain() -> None:
    # Compiled graphs use decomposed ops in another order (and their own RNG for dropout),
    # so compare without dropout and with a tolerance for fp32 reassociation.
    spec = ModelSpec(**{**vars(TINY), "dropout": 0.0})
    ref, got = _grads("none", spec, steps=1), _grads("compile_budget", spec, steps=1)
    for a, b in zip(ref[0], got[0]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_unavailable_strategies_say_why() -> None:
    reasons = {s.name: s.available(CPU) for s in get_strategies(None, Options())}
    assert reasons["save_on_cpu"] == (False, "n/a: needs a GPU")
    assert not reasons["compile_budget"][0] and "--with-compile" in reasons["compile_budget"][1]
    for name, (ok, why) in reasons.items():
        assert ok or why, f"{name} is unavailable without a reason"


def test_saved_bytes_count_matches_allocator() -> None:
    # The hook count (the base of offrecomp_auto@X% budgets) agrees with the allocator's
    # bytes still held when a plain forward returns (the loss scalar aside).
    spec = ModelSpec(**{**vars(TINY), "dropout": 0.0})
    cfg = BenchConfig(
        spec=spec, seqs=(SEQ,), batch=BATCH, device=CPU, strategies=("none",), warmup=1, repeats=1
    )
    result = run_benchmark(cfg)
    (row,) = result.rows
    assert row.status == "ok"
    counted = result.plain_saved_bytes.get(SEQ) or count_saved_bytes(
        build_model(spec.with_max_seq(SEQ), CPU),
        make_batch(spec, BATCH, SEQ, CPU),
        lambda: torch.autocast("cpu", enabled=False),
    )
    assert row.act_bytes is not None
    assert abs(row.act_bytes - counted) <= 0.02 * counted + 4096


def test_longest_fitting_doubles_then_bisects() -> None:
    probes: list[int] = []

    def fits_below(limit: int):  # type: ignore[no-untyped-def]
        def fits(s: int) -> bool:
            probes.append(s)
            return s <= limit

        return fits

    assert longest_fitting(fits_below(1000), start=256, cap=8192) == (960, False)
    assert probes[:3] == [256, 512, 1024]
    assert all(p % 64 == 0 for p in probes)
    assert longest_fitting(fits_below(10**6), start=256, cap=2048) == (2048, True)
    assert longest_fitting(fits_below(100), start=256, cap=2048) == (64, False)
    assert longest_fitting(fits_below(10), start=256, cap=2048) == (0, False)


def test_search_finds_longer_sequences_with_checkpointing() -> None:
    spec = ModelSpec(n_layers=4, hidden=32, n_heads=2, vocab=64, max_seq=64)
    cfg = BenchConfig(
        spec=spec,
        seqs=(64,),
        batch=1,
        device=CPU,
        strategies=("none", "ckpt_block"),
        warmup=0,
        repeats=1,
        mem_budget_bytes=1024 * 1024,
        search_start=64,
        search_max=1024,
    )
    result = run_benchmark(cfg)
    found = {s.strategy: s for s in result.search}
    assert set(found) == {"none", "ckpt_block"}
    for s in found.values():
        assert s.status == "ok" and s.probes
        assert all(p.peak_bytes is not None for p in s.probes)
        assert s.longest_seq is not None and s.longest_seq % 64 == 0
    assert 0 < found["none"].longest_seq < found["ckpt_block"].longest_seq  # type: ignore[operator]


def test_cli_writes_table_csv_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = [
        "--device", "cpu", "--layers", "2", "--hidden", "32", "--heads", "2",
        "--seq", "32,64", "--batch", "1", "--warmup", "1", "--repeats", "1",
        "--mem-budget", "1MiB", "--search-start", "64", "--search-max", "128",
        "--strategies", "ckpt_block,save_on_cpu,offrecomp_auto@50%",
        "--out", str(out), "--quiet",
    ]  # fmt: skip
    threads = torch.get_num_threads()
    assert main(argv) == 0
    assert torch.get_num_threads() == threads  # the CPU default of 1 thread is undone
    printed = capsys.readouterr().out
    for name in ("none", "ckpt_block", "save_on_cpu", "offrecomp_auto@50%"):
        assert name in printed
    assert "n/a: needs a GPU" in printed
    # each strategy's warm-up: auto measures, calibrates and plans before it is timed
    assert "after 1 warm-up step each (offrecomp_auto@50%: 3)" in printed
    assert "longest sequence" in printed

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["strategy"], r["seq"]) for r in rows} == {
        (n, s)
        for n in ("none", "ckpt_block", "save_on_cpu", "offrecomp_auto@50%")
        for s in ("32", "64")
    }
    by = {(r["strategy"], r["seq"]): r for r in rows}
    assert by[("none", "32")]["status"] == "ok"
    assert float(by[("none", "32")]["ratio_vs_none"]) == 1.0
    assert float(by[("ckpt_block", "64")]["median_step_ms"]) > 0

    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["hardware"]["torch"] == torch.__version__
    assert data["meta"]["command"].startswith("python -m benchmarks.long_seq")
    assert {r["strategy"] for r in data["search"]} >= {"none", "ckpt_block"}
    auto = next(r for r in data["rows"] if r["strategy"] == "offrecomp_auto@50%")
    assert auto["extras"]["explain"].startswith("plan ")  # the placements per region call
    assert (out / "longest_seq.csv").exists()
    assert (out / "memory_vs_time.png").exists() or any("plots skipped" in n for n in data["notes"])


def test_import_is_light() -> None:
    code = "import sys, benchmarks.long_seq; print('torch' in sys.modules)"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert res.stdout.strip() == "False"


@pytest.mark.skipif(not hf_available()[0], reason="transformers not installed")
def test_hf_llama_runs_checkpointed() -> None:
    spec = ModelSpec(kind="hf-llama", n_layers=2, hidden=32, n_heads=2, vocab=64, max_seq=64)
    cfg = BenchConfig(
        spec=spec,
        seqs=(32,),
        batch=1,
        device=CPU,
        strategies=("none", "ckpt_block", "ckpt_sqrt"),
        warmup=1,
        repeats=1,
    )
    rows = {r.strategy: r for r in run_benchmark(cfg).rows}
    assert rows["none"].status == "ok" and rows["ckpt_block"].status == "ok"
    assert rows["ckpt_sqrt"].status.startswith("n/a")
    assert rows["ckpt_block"].act_bytes < rows["none"].act_bytes  # type: ignore[operator]


class _Fragile(Strategy):
    """Runs plain up to 128 tokens; beyond, raises what CUDA raises when memory runs out."""

    name = "fragile"
    summary = "test double"

    def prepare(self, model: torch.nn.Module, ctx: PrepareContext) -> Runner:
        class _R(Runner):
            def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                if idx.shape[1] > 128:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
                return self.model(idx, targets)

        return _R(model)


class _Broken(Strategy):
    name = "broken"
    summary = "test double"

    def prepare(self, model: torch.nn.Module, ctx: PrepareContext) -> Runner:
        raise ValueError("cannot wrap this model")


def test_oom_and_failures_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Out of memory means "does not fit" in the search and "oom" in the table; any other
    # failure is reported with its reason; the run goes on either way.
    import benchmarks.long_seq.measure as measure

    real = measure.get_strategies
    monkeypatch.setattr(
        measure,
        "get_strategies",
        lambda names, options: [*real(["none"], options), _Fragile(), _Broken()],
    )
    spec = ModelSpec(n_layers=2, hidden=32, n_heads=2, vocab=64, max_seq=64)
    cfg = BenchConfig(
        spec=spec,
        seqs=(64, 256),
        batch=1,
        device=CPU,
        warmup=0,
        repeats=1,
        mem_budget_bytes=1 << 40,
        search_start=64,
        search_max=512,
    )
    result = run_benchmark(cfg)
    rows = {(r.strategy, r.seq): r for r in result.rows}
    assert rows[("fragile", 64)].status == "ok"
    assert rows[("fragile", 256)].status == "oom"
    assert rows[("broken", 64)].status == "failed: ValueError: cannot wrap this model"
    assert rows[("none", 256)].status == "ok"
    search = {s.strategy: s for s in result.search}
    assert search["fragile"].longest_seq == 128
    assert any(p.note == "oom" for p in search["fragile"].probes)
    assert search["none"].longest_seq == 512 and search["none"].capped
    assert search["broken"].status.startswith("failed: ValueError")


def test_search_only_with_auto_at_the_step_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --no-compare runs the search alone; offrecomp_auto@budget gets --mem-budget less
    # the gradients (NOTE [Step budget for auto]).
    out = tmp_path / "out"
    argv = [
        "--device", "cpu", "--layers", "2", "--hidden", "32", "--heads", "2", "--batch", "1",
        "--no-compare", "--mem-budget", "2MiB", "--search-start", "64", "--search-max", "128",
        "--search-quantum", "32",
        "--strategies", "offrecomp_auto@budget", "--out", str(out), "--quiet", "--no-plots",
    ]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["rows"] == []
    found = {s["strategy"]: s for s in data["search"]}
    assert set(found) == {"none", "offrecomp_auto@budget"}
    assert found["offrecomp_auto@budget"]["status"] == "ok"
    assert found["offrecomp_auto@budget"]["probes"]
    assert all(p["seq"] % 32 == 0 for s in found.values() for p in s["probes"])
    assert "longest sequence" in capsys.readouterr().out


def test_auto_at_the_step_budget_leaves_out_the_gradients() -> None:
    model = build_model(TINY, CPU)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    assert activation_budget(model, grads + 1000) == 1000
    with pytest.raises(NotApplicable, match="gradients"):
        activation_budget(model, grads)
    (strategy,) = [s for s in get_strategies(["offrecomp_auto@budget"]) if s.name != "none"]
    assert strategy.available(CPU) == (
        False,
        "n/a: needs --mem-budget (its budget is the search's)",
    )
    (strategy,) = [
        s
        for s in get_strategies(["offrecomp_auto@budget"], Options(step_budget_bytes=grads + 4096))
        if s.name != "none"
    ]
    assert strategy.available(CPU)[0]
    runner = strategy.prepare(model, PrepareContext(device=CPU, seq=SEQ, plain_saved_bytes=None))
    try:
        assert runner.runtime_kwargs == {"mode": "auto", "budget": 4096}  # type: ignore[attr-defined]
    finally:
        runner.close()


def test_no_compare_needs_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(main, ["--device", "cpu", "--no-compare", "--no-search", "--quiet"], capsys)
    assert "--no-compare with --no-search leaves nothing to run" in said


def test_a_search_without_a_budget_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import benchmarks.long_seq.measure as measure

    monkeypatch.setattr(measure, "run_benchmark", started)
    said = refused(main, ["--device", "cpu", "--no-compare", "--mem-budget", "none", "--quiet"], capsys)
    assert "--no-compare with --mem-budget none leaves nothing to run: the search needs a budget" in said


#: A run that would end at once (one block, 32 tokens, --max-seconds 0.01): where a check
#: were missing, the test would see it exit 0, not hang.
_QUICK = ["--device", "cpu", "--layers", "1", "--batch", "1", "--seq", "32", "--no-search",
          "--max-seconds", "0.01", "--quiet", "--no-plots"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--dropout", "2"], "argument --dropout: '2' is invalid; accepted: a number in [0, 1)"),
        (["--dropout", "-0.1"], "argument --dropout: '-0.1' is invalid; accepted: a number in [0, 1)"),
        (["--heads", "3"], "--hidden 128 (preset cpu-tiny's) is not a multiple of --heads 3; accepted: "
                           "a head count that divides the width (1, 2, 4, 8, 16, 32, 64, 128)"),
        (["--hidden", "100", "--heads", "8"], "--hidden 100 is not a multiple of --heads 8"),
        (["--heads", "0"], "argument --heads: '0' is invalid; accepted: an integer, 1 or more"),
        (["--layers", "0"], "argument --layers: '0' is invalid; accepted: an integer, 1 or more"),
        (["--max-seconds", "-1"], "argument --max-seconds: '-1' is invalid; accepted: a number > 0"),
        (["--max-seconds", "0"], "argument --max-seconds: '0' is invalid; accepted: a number > 0"),
        (["--compile-budget", "7"], "argument --compile-budget: '7' is invalid; accepted: a number in [0, 1]"),
        (["--search-start", "1000", "--search-max", "10"],
         "--search-start 1000 is above --search-max 10; accepted: a first length at most the longest"),
        (["--search-start", "4096"], "--search-start 4096 is above --search-max 2048 (preset cpu-tiny's)"),
        (["--search-max", "0"], "argument --search-max: '0' is invalid; accepted: an integer, 1 or more"),
        (["--strategies", ""], "--strategies: names no strategy; accepted: a comma-separated list of none, "),
        (["--strategies", " , "], "--strategies: names no strategy; accepted: a comma-separated list of none, "),
        (["--strategies", "ckpt_block,nope"], "--strategies: unknown nope; accepted: a comma-separated list of none, "),
        (["--mem-budget", "0"], "--mem-budget='0' is invalid; accepted: a size of 1 byte or more (e.g. 24MiB), or none"),
        (["--mem-budget", "lots"], "--mem-budget='lots' is invalid; accepted: bytes or a number with a unit"),
        (["--peak-tflops", "0"], "argument --peak-tflops: '0' is invalid; accepted: a number > 0"),
        (["--threads", "0"], "argument --threads: '0' is invalid; accepted: an integer, 1 or more"),
        (["--warmup", "-1"], "argument --warmup: '-1' is invalid; accepted: an integer, 0 or more"),
        (["--device", "tpu"], "--device 'tpu' is invalid; accepted: auto, cpu, cuda, cuda:N"),
        (["--preset", "huge"], "--preset 'huge' is invalid; accepted: auto, cpu-tiny, "),
        (["--out", str(ROOT / "pyproject.toml")], "is a file; accepted: a folder (made if missing)"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    argv: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import benchmarks.long_seq.measure as measure

    monkeypatch.setattr(measure, "run_benchmark", started)
    threads = torch.get_num_threads()
    line = refused(main, [*_QUICK, "--out", str(tmp_path / "out"), *argv], capsys)
    assert said in line and line.startswith("python -m benchmarks.long_seq: error: "), line
    assert torch.get_num_threads() == threads and not (tmp_path / "out").exists()


def test_fixed_position_table_and_dynamic_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --max-seq fixes the parameters across runs (so compiled graphs can be reused from
    # the on-disk cache); --compile-dynamic compiles one graph for every length.
    out = tmp_path / "out"
    argv = [
        "--device", "cpu", "--layers", "2", "--hidden", "32", "--heads", "2", "--batch", "1",
        "--seq", "32,64", "--max-seq", "4096", "--no-search", "--warmup", "0", "--repeats", "1",
        "--strategies", "compile_budget", "--with-compile", "--compile-dynamic",
        "--compile-backend", "aot_eager_decomp_partition", "--out", str(out), "--quiet",
        "--no-plots",
    ]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["model"]["max_seq"] == 4096
    assert all(r["status"] == "ok" for r in data["rows"]), data["rows"]
    with pytest.raises(SystemExit, match="2"):
        main([*argv, "--max-seq", "0"])
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    ctx = PrepareContext(device=CPU, seq=SEQ, plain_saved_bytes=None)
    for dynamic in (False, True):
        model = build_model(TINY, CPU)
        CompileBudget(Options(with_compile=True, compile_dynamic=dynamic)).prepare(model, ctx)
    assert [c["dynamic"] for c in calls] == [None, True]


class _Counting(Strategy):
    """Plain steps, counted; a long warm-up floor and a shorter search floor."""

    name = "counting"
    summary = "test double"
    steps = 0

    def prepare(self, model: torch.nn.Module, ctx: PrepareContext) -> Runner:
        class _R(Runner):
            warmup_floor = 9
            search_floor = 3

            def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                _Counting.steps += 1
                return self.model(idx, targets)

        return _R(model)


def test_search_probe_runs_the_search_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    # A probe runs search_floor + 1 steps (offrecomp auto: measure, calibrate, two planned
    # steps), not the warm-up floor, which on a GPU includes the offload trial.
    import benchmarks.long_seq.measure as measure

    monkeypatch.setattr(measure, "get_strategies", lambda names, options: [_Counting()])
    spec = ModelSpec(n_layers=2, hidden=32, n_heads=2, vocab=64, max_seq=64)
    cfg = BenchConfig(
        spec=spec, seqs=(), batch=1, device=CPU, mem_budget_bytes=1 << 40,
        search_start=64, search_max=64,
    )  # fmt: skip
    (found,) = run_benchmark(cfg).search
    assert found.longest_seq == 64 and len(found.probes) == 1
    assert _Counting.steps == 4
    from benchmarks.long_seq.strategies import _OffrecompRunner

    assert _OffrecompRunner.search_floor == 3


def test_no_offload_baselines_run_only_when_named() -> None:
    assert {"offrecomp_auto_no_offload@50%", "offrecomp_auto_no_offload@25%"} == ON_REQUEST
    assert not ON_REQUEST & {s.name for s in get_strategies(None)}
    model = build_model(TINY, CPU)
    (strategy,) = [s for s in get_strategies(["offrecomp_auto_no_offload@25%"]) if s.name != "none"]
    runner = strategy.prepare(model, PrepareContext(device=CPU, seq=SEQ, plain_saved_bytes=4000))
    try:
        assert runner.runtime_kwargs == {  # type: ignore[attr-defined]
            "mode": "auto", "budget": 1000, "d2h_gbps": NO_LINK_GBPS, "h2d_gbps": NO_LINK_GBPS,
        }
    finally:
        runner.close()


@pytest.mark.parametrize("frac", [0.5, 0.25])
def test_no_link_leaves_the_planner_no_offload_where_a_fast_one_offloads(frac: float) -> None:
    # the baseline's premise: the same budget, a link that moves nothing, no offloads
    def profile(gbps: float) -> Profile:
        return gpt_profile(layers=8, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=990,
                           d2h_gbps=gbps, h2d_gbps=gbps)

    budget = int(simulate(profile(200.0), Plan()).peak_bytes * frac)
    assert solve(profile(200.0), budget_bytes=budget).counts()[Placement.OFFLOAD] > 0
    plan = solve(profile(NO_LINK_GBPS), budget_bytes=budget)
    assert plan.counts()[Placement.OFFLOAD] == 0 and plan.feasible
