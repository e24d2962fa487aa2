"""CostModel: moving averages of measured profiles; predict()."""

from __future__ import annotations

import math

import pytest

from scheduler import CostModel, Placement, Plan, gpt_profile, predict, simulate
from scheduler.profile import Profile


def measured(scale: float = 1.0, d2h: float = 50.0) -> Profile:
    p = gpt_profile(
        layers=2,
        hidden=256,
        heads=4,
        seq=128,
        batch=1,
        device_tflops=100,
        d2h_gbps=d2h,
        h2d_gbps=d2h,
    )
    for r in p.regions:
        r.forward_seconds *= scale
        r.backward_seconds *= scale
        r.start_seconds *= scale
        for op in r.ops:
            op.seconds *= scale
        for s in r.storages:
            s.offset_seconds *= scale
    p.forward_seconds *= scale
    p.backward_seconds *= scale
    return p


def test_identical_updates_leave_the_estimate_as_the_measurement() -> None:
    """A moving average of equal values is that value exactly: no ulp drift, which can
    flip a plan solved on the estimate against one solved on the profile."""
    cm = CostModel(alpha=0.3)
    p = measured(scale=0.1)
    for _ in range(5):
        cm.update(measured(scale=0.1))
    assert cm.estimate() == p
    assert cm.drift(p) == 0.0


def test_first_update_is_the_measurement() -> None:
    cm = CostModel(alpha=0.5)
    p = measured()
    cm.update(p)
    est = cm.estimate()
    assert est == p and est is not p
    assert cm.samples == 1 and cm.signature == p.signature


def test_times_are_exponential_moving_averages() -> None:
    cm = CostModel(alpha=0.25)
    cm.update(measured(1.0))
    cm.update(measured(3.0))
    base, est = measured(1.0), cm.estimate()
    # 0.75 * 1 + 0.25 * 3 = 1.5 times the base
    assert est.forward_seconds == pytest.approx(1.5 * base.forward_seconds)
    assert est.regions[1].ops[1].seconds == pytest.approx(1.5 * base.regions[1].ops[1].seconds)
    assert est.regions[1].storages[4].offset_seconds == pytest.approx(
        1.5 * base.regions[1].storages[4].offset_seconds
    )
    assert est.regions[0].backward_seconds == pytest.approx(1.5 * base.regions[0].backward_seconds)
    # bytes are structure: taken as measured
    assert est.regions[0].storages[0].nbytes == base.regions[0].storages[0].nbytes


def test_bandwidth_zero_means_not_measured() -> None:
    cm = CostModel(alpha=0.5)
    cm.update(measured(d2h=40.0))
    cm.update(measured(d2h=0.0))
    assert cm.estimate().d2h_gbps == 40.0
    cm.update(measured(d2h=60.0))
    assert cm.estimate().d2h_gbps == 50.0


def test_changed_region_starts_afresh() -> None:
    cm = CostModel(alpha=0.5)
    cm.update(measured(1.0))
    new = measured(3.0)
    new.regions[0].ops.pop()
    cm.update(new)
    est = cm.estimate()
    assert est.regions[0].forward_seconds == new.regions[0].forward_seconds
    assert est.regions[1].forward_seconds == pytest.approx(
        2.0 * measured(1.0).regions[1].forward_seconds
    )


def test_signature_mismatch_and_bad_alpha() -> None:
    cm = CostModel()
    cm.update(measured())
    other = measured()
    other.signature = "gpt:s=256,b=1"
    with pytest.raises(ValueError, match="keep one CostModel per signature"):
        cm.update(other)
    with pytest.raises(ValueError, match=r"accepted: a number in \(0, 1\]"):
        CostModel(alpha=0.0)
    with pytest.raises(ValueError, match="no measurements yet"):
        CostModel().estimate()


def test_drift() -> None:
    cm = CostModel()
    assert math.isinf(cm.drift(measured()))
    cm.update(measured())
    assert cm.drift(measured()) == 0.0
    assert cm.drift(measured(1.2)) == pytest.approx(0.2)


def test_predict_is_the_simulator() -> None:
    p = measured()
    plan = Plan(
        placements={("layers.0", 0, 1): Placement.RECOMPUTE, ("layers.0", 0, 0): Placement.OFFLOAD}
    )
    pr = predict(p, plan)
    t = simulate(p, plan)
    assert (pr.step_seconds, pr.peak_bytes, pr.recompute_seconds, pr.stall_seconds) == (
        t.step_seconds,
        t.peak_bytes,
        t.recompute_seconds,
        t.stall_seconds,
    )
    assert pr.d2h_bytes == pr.h2d_bytes == p.regions[0].storages[0].nbytes
    assert pr.recompute_seconds > 0


def test_host_costs_are_moving_averages_and_zero_is_not_measured() -> None:
    cm = CostModel(alpha=0.5)
    a = measured()
    a.pack_host_seconds, a.offload_host_seconds = 10e-6, 40e-6
    a.regions[0].host_seconds = 1.0
    cm.update(a)
    b = measured()
    b.pack_host_seconds, b.reload_host_seconds = 20e-6, 30e-6  # no offload measured
    b.regions[0].host_seconds = 3.0
    b.regions[1].host_seconds = 2.0
    cm.update(b)
    est = cm.estimate()
    assert est.pack_host_seconds == pytest.approx(15e-6)
    assert est.offload_host_seconds == pytest.approx(40e-6)  # kept
    assert est.reload_host_seconds == pytest.approx(30e-6)  # first measurement
    assert est.unpack_host_seconds == 0.0
    assert est.regions[0].host_seconds == pytest.approx(2.0)
    assert est.regions[1].host_seconds == pytest.approx(2.0)
    c = measured()  # host times not measured: the estimate's stand
    cm.update(c)
    assert cm.estimate().regions[0].host_seconds == pytest.approx(2.0)


def test_a_failed_measurement_never_stays_in_the_estimate() -> None:
    """A time or bandwidth that is not finite (NaN from a failed timing) stayed in the
    moving average for good, drift() read 0 for it, and every solve of the estimate
    raised from then on. It leaves the other value as it is; drift() is infinite."""
    from scheduler import solve

    cm = CostModel()
    cm.update(measured())
    bad = measured(1.2, d2h=math.nan)
    bad.regions[0].forward_seconds = math.nan
    bad.regions[0].ops[0].seconds = math.inf
    assert math.isinf(cm.drift(bad))
    cm.update(bad)
    est = cm.estimate()
    clean = measured()
    assert est.regions[0].forward_seconds == clean.regions[0].forward_seconds
    assert est.regions[0].ops[0].seconds == clean.regions[0].ops[0].seconds
    assert est.d2h_gbps == clean.d2h_gbps
    assert est.regions[1].forward_seconds == pytest.approx(clean.regions[1].forward_seconds * 1.06)  # alpha 0.3
    solve(est, budget_bytes=None)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, 1.5, True, 2**63, 10**30])
def test_a_host_limit_that_is_no_byte_count_is_named(value: object) -> None:
    from scheduler import solve

    p = measured()
    p.host_limit_bytes = value  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"host_limit_bytes = .* is invalid; accepted: a whole number of bytes"):
        solve(p, budget_bytes=None)
