"""Long-sequence training benchmark: offrecomp against checkpointing and offload peers.

``python -m benchmarks.long_seq`` runs it (``--help`` for options). Importing this package
imports nothing heavy; the submodules (``models``, ``strategies``, ``measure``, ``output``,
``presets``) import torch.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark command line with ``argv`` (``sys.argv[1:]`` when ``None``)."""
    from .__main__ import main as _main

    return _main(argv)
