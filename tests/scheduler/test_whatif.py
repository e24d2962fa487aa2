"""gpt_profile: byte accounting (Korthikanti et al.), op positions and times."""

from __future__ import annotations

import pytest

from scheduler import gpt_profile, replay_seconds
from scheduler.profile import Profile

S, B, H, A = 2048, 2, 1024, 16


def profile(**kw: object) -> Profile:
    args: dict[str, object] = {
        "layers": 2,
        "hidden": H,
        "heads": A,
        "seq": S,
        "batch": B,
        "device_tflops": 400.0,
        "d2h_gbps": 50.0,
        "h2d_gbps": 50.0,
    }
    args.update(kw)
    return gpt_profile(**args)  # type: ignore[arg-type]


def layer_bytes(p: Profile) -> int:
    return sum(s.nbytes for s in p.regions[0].storages)


def test_fused_attention_saves_about_34_sbh() -> None:
    sbh = S * B * H
    per_layer = layer_bytes(profile())
    # 34 s*b*h in 16-bit plus fp32 row statistics (layernorm mean/rstd, logsumexp)
    assert 34 * sbh <= per_layer <= 34.2 * sbh
    assert layer_bytes(profile(micro_ops=False)) == 34 * sbh + 4 * B * A * S
    assert layer_bytes(profile(micro_ops=False, dropout=False)) == 32 * sbh + 4 * B * A * S


def test_unfused_attention_adds_5_a_s_over_h() -> None:
    sbh = S * B * H
    got = layer_bytes(profile(fused_attention=False, micro_ops=False))
    assert got == sbh * 34 + 5 * A * S * S * B


def test_storage_positions_are_consistent_with_the_ops() -> None:
    p = profile()
    for r in p.regions:
        starts = [0.0]
        for op in r.ops:
            starts.append(starts[-1] + op.seconds)
        assert r.forward_seconds == pytest.approx(starts[-1])
        assert r.backward_seconds == pytest.approx(2 * r.forward_seconds)
        for i, s in enumerate(r.storages):
            assert 0 <= s.first_save_op <= s.last_save_op <= len(r.ops)
            assert s.offset_seconds == pytest.approx(starts[s.first_save_op])
            if s.kind == "activation":
                assert s.producer_op < s.last_save_op
                assert i in r.ops[s.producer_op].outputs
            else:
                assert s.kind == "input" and s.producer_op == -1 and i == 0
    assert [r.start_seconds for r in p.regions] == pytest.approx(
        [0.0, p.regions[0].forward_seconds]
    )


def test_matmul_times_follow_flops() -> None:
    p = profile(mfu=0.5, device_tflops=400.0)
    fc1 = next(
        op
        for op in p.regions[0].ops
        if op.outputs and op.name == "aten::addmm" and op.flops == 2.0 * S * B * H * 4 * H
    )
    assert fc1.seconds == pytest.approx(fc1.flops / (400e12 * 0.5))


def test_dropping_after_the_output_projection_reruns_it() -> None:
    r = profile().regions[0]
    proj = next(j for j, op in enumerate(r.ops) if op.outputs == (-1,) and op.name == "aten::addmm")
    late = next(i for i, s in enumerate(r.storages) if s.last_save_op > proj + 1)
    early = 1  # layernorm output, saved before the QKV matmul
    cost_late = replay_seconds(r, {late: "recompute"})
    assert cost_late >= r.ops[proj].seconds
    assert replay_seconds(r, {early: "recompute"}) == pytest.approx(r.ops[0].seconds)


@pytest.mark.parametrize(
    "kw", [{}, {"fused_attention": False}, {"dropout": False}, {"micro_ops": False}]
)
def test_ops_carry_dataflow(kw: dict[str, object]) -> None:
    r = profile(**kw).regions[0]
    views = {j for j, op in enumerate(r.ops) if op.name in ("aten::split", "aten::view")}
    for j, op in enumerate(r.ops):
        assert op.reads is not None and all(0 <= x < j for x in op.reads)
        assert not views & set(op.reads)  # views create nothing: readers list the creator
        assert op.sink == (op.name == "aten::native_dropout")
    assert r.ops[0].reads == ()  # the first layernorm reads the block input only
    for i, s in enumerate(r.storages):
        if s.kind == "activation":
            assert i in r.ops[s.producer_op].outputs


@pytest.mark.parametrize("dropout", [True, False])
def test_dropping_the_gelu_output_costs_little(dropout: bool) -> None:
    r = profile(dropout=dropout).regions[0]
    names = [op.name for op in r.ops]
    gelu = names.index("aten::gelu")
    act = r.ops[gelu].outputs[0]
    cost = replay_seconds(r, {act: "recompute"})
    # gelu and the view of the attention output before it (a view replays whenever it
    # lies before the stop)
    view = names.index("aten::view")
    assert view < gelu and r.ops[view].view
    expected = r.ops[gelu].seconds + r.ops[view].seconds
    if dropout:
        # the attention dropout before it is a sink; it reads the unsaved projection
        drop1 = names.index("aten::native_dropout")
        expected += r.ops[drop1].seconds + r.ops[drop1 - 1].seconds
    assert cost == pytest.approx(expected)
    # far below rerunning the block up to it
    assert cost < 0.25 * sum(op.seconds for op in r.ops[:gelu])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="not divisible by heads"):
        profile(heads=7)
    with pytest.raises(ValueError, match="layers = 0 is invalid"):
        profile(layers=0)
    with pytest.raises(ValueError, match="mfu"):
        profile(mfu=1.5)
