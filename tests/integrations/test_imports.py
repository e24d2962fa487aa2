"""``import offrecomp`` (and the integrations package) never imports a training framework:
each integration module imports its own, only when it is imported."""

from __future__ import annotations

import subprocess
import sys


def test_import_offrecomp_imports_no_framework() -> None:
    code = (
        "import sys, offrecomp, offrecomp.integrations, offrecomp.integrations._common; "
        "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning', 'accelerate', "
        "'torchtune', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
