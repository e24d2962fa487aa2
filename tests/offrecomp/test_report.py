"""``Report``: ``to_json`` and ``from_json`` are inverses, and a bad text is refused
naming the record and the field."""

from __future__ import annotations

import json

import pytest

import offrecomp
from offrecomp.report import Report, ReportFileError, StepRecord
from tests.helpers import make, train


def test_from_json_reads_what_to_json_wrote() -> None:
    model, batch = make("gpt_dropout")
    rt = offrecomp.runtime(model, min_bytes=0)
    train(model, batch, rt, steps=3)
    report = rt.report()
    back = Report.from_json(report.to_json())
    assert back == report and len(back.steps) == 3
    assert back.steps[2].fallbacks == report.steps[2].fallbacks
    assert str(back) == str(report)
    assert Report.from_json(report.to_json(indent=2).encode()) == report


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object with a 'steps' list"),
        ('{"steps": [], "config": 3}', "'config' is 3"),
        ('{"steps": [{"phase": "planned"}]}', "steps[0]: expected a step record"),
        ('{"steps": [{"step": 0}, {"step": 1, "kept_bytes": -1}]}', "steps[1]: field 'kept_bytes' is -1"),
        ('{"steps": [{"step": 0, "notes": [1]}]}', "steps[0]: field 'notes'"),
        ('{"steps": [{"step": 0, "fallbacks": {"x": 1.5}}]}', "steps[0]: field 'fallbacks' counts 1.5"),
    ],
)
def test_from_json_refuses_what_is_no_report(text: str, said: str) -> None:
    with pytest.raises(ReportFileError, match=None) as err:
        Report.from_json(text)
    assert said in str(err.value), str(err.value)
    assert isinstance(err.value, ValueError)


def test_from_dict_skips_unknown_fields_and_keeps_defaults() -> None:
    """A record a later version wrote (a field added, one dropped) still reads."""
    rec = StepRecord.from_dict({"step": 4, "field_of_later_version": 1, "kept_bytes": 8})
    assert rec == StepRecord(step=4, kept_bytes=8)
    assert json.loads(json.dumps(rec.to_dict()))["kept_bytes"] == 8
