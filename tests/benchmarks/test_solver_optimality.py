"""benchmarks/solver_optimality.py refuses a bad count of profiles before it solves any."""

from __future__ import annotations

import pytest

from benchmarks import solver_optimality
from tests.benchmarks.refused import refused, started


@pytest.mark.parametrize("flag", ["--profiles", "--dataflow"])
@pytest.mark.parametrize("value", ["-1", "0", "many"])
def test_a_count_of_profiles_below_one_is_refused(
    flag: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(solver_optimality, "run", started)
    said = refused(solver_optimality.main, [flag, value], capsys)
    assert f"argument {flag}: '{value}' is invalid; accepted: an integer, 1 or more" in said
