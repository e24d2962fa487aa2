"""A command line a benchmark script refuses, the argparse way: exit status 2, the usage
line, and one message (``prog: error: ...``), before any work starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import pytest


def refused(main: Callable[[list[str]], Any], argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line ``main(argv)`` exits with (status 2, after the usage line)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert ": error: " in last, err
    return last


def started(*args: object, **kw: object) -> NoReturn:
    """A stand-in for a script's first expensive call, where a refusal must come first."""
    pytest.fail("the work started before the command line was refused")
