"""Is torch.linalg.lstsq bitwise repeatable on CPU? (efficient-kan update_grid uses it)."""
import torch
torch.manual_seed(0)
A = torch.randn(16, 32, 8); B = torch.randn(16, 32, 5)
for drv in ("gelsy", "gels", "gelsd", "gelss"):
    outs = [torch.linalg.lstsq(A.clone(), B.clone(), driver=drv).solution for _ in range(20)]
    print(drv, "repeatable" if all(torch.equal(outs[0], o) for o in outs) else "DIFFERS",
          max((outs[0] - o).abs().max().item() for o in outs))
