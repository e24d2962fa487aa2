"""offrecomp: keep, offload or recompute every activation autograd saves."""

__version__ = "0.1.0"
