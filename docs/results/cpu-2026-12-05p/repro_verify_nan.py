"""OFFRECOMP_VERIFY=1 raises ReplayMismatchError for a deterministic replay whose save
holds a NaN (or both +inf and -inf, whose fingerprint sum is NaN): verify.py compares
fingerprints with torch.allclose without equal_nan, and NaN != NaN."""
import os
os.environ["OFFRECOMP_VERIFY"] = "1"
import torch
from torch import nn
import offrecomp


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        # overflows both ways (as in an fp16 step a GradScaler then skips): the fingerprint's sum is inf + -inf = NaN
        h = torch.where(h > 1.5, torch.tensor(float("inf")), torch.where(h < -1.5, torch.tensor(float("-inf")), h))
        return torch.nan_to_num(torch.sigmoid(h) * h, nan=0.0, posinf=1.0)


torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(3)])
x = torch.randn(4, 8) * 3
ref = nn.Sequential(*[Block() for _ in range(3)]); ref.load_state_dict(model.state_dict())
ref(x).sum().backward()
try:
    with offrecomp.runtime(model, mode="recompute", min_bytes=0):
        model(x).sum().backward()
    print("no error; grads equal:", all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), model.parameters())))
except Exception as e:
    print(type(e).__name__, str(e)[:300])
