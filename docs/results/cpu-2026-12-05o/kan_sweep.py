"""KAN networks under the six zoo variants: efficient-kan's KANLinear/KAN (Blealtan/efficient-kan,
src/efficient_kan/kan.py, written out by hand: not on PyPI), with and without grid updates,
and pykan's MultKAN (pykan 0.2.8; sklearn and pandas stubbed, used only by its symbolic tools).

cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05o/kan_sweep.py [NAMES] [VARIANTS] [-v] [--det]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
import types

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))
import torch
import torch.nn.functional as F
from common import gen, run
from torch import nn


DRIVER: dict = {}  # torch's default CPU lstsq driver, gelsy, is not bitwise repeatable (probe_lstsq.py)


class KANLinear(nn.Module):
    def __init__(self, in_features, out_features, grid_size=5, spline_order=3, scale_noise=0.1, scale_base=1.0,
                 scale_spline=1.0, enable_standalone_scale_spline=True, base_activation=nn.SiLU, grid_eps=0.02,
                 grid_range=(-1, 1)):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.grid_size, self.spline_order = grid_size, spline_order
        h = (grid_range[1] - grid_range[0]) / grid_size
        grid = (torch.arange(-spline_order, grid_size + spline_order + 1) * h + grid_range[0]).expand(in_features, -1).contiguous()
        self.register_buffer("grid", grid)
        self.base_weight = nn.Parameter(torch.Tensor(out_features, in_features))
        self.spline_weight = nn.Parameter(torch.Tensor(out_features, in_features, grid_size + spline_order))
        if enable_standalone_scale_spline:
            self.spline_scaler = nn.Parameter(torch.Tensor(out_features, in_features))
        self.scale_noise, self.scale_base, self.scale_spline = scale_noise, scale_base, scale_spline
        self.enable_standalone_scale_spline = enable_standalone_scale_spline
        self.base_activation = base_activation()
        self.grid_eps = grid_eps
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * self.scale_base)
        with torch.no_grad():
            noise = (torch.rand(self.grid_size + 1, self.in_features, self.out_features) - 1 / 2) * self.scale_noise / self.grid_size
            self.spline_weight.data.copy_(
                (self.scale_spline if not self.enable_standalone_scale_spline else 1.0)
                * self.curve2coeff(self.grid.T[self.spline_order: -self.spline_order], noise))
            if self.enable_standalone_scale_spline:
                nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * self.scale_spline)

    def b_splines(self, x):
        grid = self.grid
        x = x.unsqueeze(-1)
        bases = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
        for k in range(1, self.spline_order + 1):
            bases = ((x - grid[:, : -(k + 1)]) / (grid[:, k:-1] - grid[:, : -(k + 1)]) * bases[:, :, :-1]) + (
                (grid[:, k + 1:] - x) / (grid[:, k + 1:] - grid[:, 1:(-k)]) * bases[:, :, 1:])
        return bases.contiguous()

    def curve2coeff(self, x, y):
        A = self.b_splines(x).transpose(0, 1)
        B = y.transpose(0, 1)
        solution = torch.linalg.lstsq(A, B, driver=DRIVER.get("d")).solution
        return solution.permute(2, 0, 1).contiguous()

    @property
    def scaled_spline_weight(self):
        return self.spline_weight * (self.spline_scaler.unsqueeze(-1) if self.enable_standalone_scale_spline else 1.0)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        base_output = F.linear(self.base_activation(x), self.base_weight)
        spline_output = F.linear(self.b_splines(x).view(x.size(0), -1),
                                 self.scaled_spline_weight.view(self.out_features, -1))
        return (base_output + spline_output).reshape(*shape[:-1], self.out_features)

    @torch.no_grad()
    def update_grid(self, x, margin=0.01):
        batch = x.size(0)
        splines = self.b_splines(x).permute(1, 0, 2)
        orig_coeff = self.scaled_spline_weight.permute(1, 2, 0)
        unreduced = torch.bmm(splines, orig_coeff).permute(1, 0, 2)
        x_sorted = torch.sort(x, dim=0)[0]
        grid_adaptive = x_sorted[torch.linspace(0, batch - 1, self.grid_size + 1, dtype=torch.int64)]
        uniform_step = (x_sorted[-1] - x_sorted[0] + 2 * margin) / self.grid_size
        grid_uniform = torch.arange(self.grid_size + 1, dtype=torch.float32).unsqueeze(1) * uniform_step + x_sorted[0] - margin
        grid = self.grid_eps * grid_uniform + (1 - self.grid_eps) * grid_adaptive
        grid = torch.concatenate([
            grid[:1] - uniform_step * torch.arange(self.spline_order, 0, -1).unsqueeze(1), grid,
            grid[-1:] + uniform_step * torch.arange(1, self.spline_order + 1).unsqueeze(1)], dim=0)
        self.grid.copy_(grid.T)
        self.spline_weight.data.copy_(self.curve2coeff(x, unreduced))

    def regularization_loss(self, regularize_activation=1.0, regularize_entropy=1.0):
        l1_fake = self.spline_weight.abs().mean(-1)
        act = l1_fake.sum()
        p = l1_fake / act
        return regularize_activation * act + regularize_entropy * -torch.sum(p * p.log())


class KAN(nn.Module):
    def __init__(self, layers_hidden, **kw):
        super().__init__()
        self.layers = nn.ModuleList(KANLinear(i, o, **kw) for i, o in zip(layers_hidden, layers_hidden[1:]))

    def forward(self, x, update_grid=False):
        for layer in self.layers:
            if update_grid:
                layer.update_grid(x)
            x = layer(x)
        return x

    def regularization_loss(self, a=1.0, e=1.0):
        return sum(layer.regularization_loss(a, e) for layer in self.layers)


class KANLoss(nn.Module):
    """Task loss + 1e-3 * regularization (efficient-kan's README), optionally the grid update
    efficient-kan's examples run every few steps (here: every step, in the forward)."""

    def __init__(self, kan, update_grid=False, reg=1e-3):
        super().__init__()
        self.kan, self.update_grid, self.reg = kan, update_grid, reg

    def forward(self, batch):
        x, y = batch
        out = self.kan(x, update_grid=self.update_grid)
        return F.cross_entropy(out, y) + self.reg * self.kan.regularization_loss()


class GridInRegion(KANLinear):
    """A KAN layer that adapts its own grid inside its forward in training (buffer and
    parameter rewritten under no_grad within the region)."""

    def forward(self, x):
        if self.training:
            self.update_grid(x.reshape(-1, self.in_features))
        return super().forward(x)


class KANGridIn(KAN):
    def __init__(self, layers_hidden, **kw):
        nn.Module.__init__(self)
        self.layers = nn.ModuleList(GridInRegion(i, o, **kw) for i, o in zip(layers_hidden, layers_hidden[1:]))


class KANConvNet(nn.Module):
    """KAN layers applied per position of a conv feature map (a KAN head over tokens)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, 2, 1)
        self.layers = nn.ModuleList([KANLinear(8, 8, grid_size=4), KANLinear(8, 8, grid_size=4, spline_order=2),
                                     KANLinear(8, 8, grid_size=6)])
        self.out = nn.Linear(8, 3)

    def forward(self, batch):
        x, y = batch
        h = self.conv(x).flatten(2).transpose(1, 2)  # (b, 16, 8)
        for layer in self.layers:
            h = h + layer(F.layer_norm(h, (8,)))
        return F.cross_entropy(self.out(h.mean(1)), y) + 1e-3 * sum(l.regularization_loss() for l in self.layers)


def tab(nf=8, b=32, nc=3):
    return lambda s: (torch.rand(b, nf, generator=gen(s)) * 2 - 1, torch.randint(0, nc, (b,), generator=gen(s)))


def pykan_model():
    for name in ("sklearn", "sklearn.linear_model", "sklearn.cluster", "pandas"):
        mod = types.ModuleType(name)
        mod.LinearRegression = mod.AgglomerativeClustering = object
        import importlib.machinery
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules.setdefault(name, mod)
    from kan.MultKAN import MultKAN

    class PyKAN(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = MultKAN(width=[8, [4, 2], 3], grid=5, k=3, seed=0, auto_save=False, save_act=True,
                             symbolic_enabled=True, device="cpu")

        def forward(self, batch):
            x, y = batch
            out = self.m(x)
            return F.cross_entropy(out, y) + 1e-3 * self.m.get_reg("edge_forward_spline_n", 1.0, 2.0, 0.0, 0.0)

    return PyKAN()


Z = {
    "effkan_mlp": (lambda: KANLoss(KAN([8, 16, 16, 3])), tab()),
    "effkan_deep": (lambda: KANLoss(KAN([8, 12, 12, 12, 12, 3], grid_size=8, spline_order=2)), tab()),
    "effkan_update_grid": (lambda: (DRIVER.clear(), KANLoss(KAN([8, 16, 16, 3]), update_grid=True))[1], tab()),
    "effkan_grid_in_region": (lambda: (DRIVER.clear(), KANLoss(KANGridIn([8, 16, 16, 3])))[1], tab()),
    "effkan_update_grid_gelsd": (lambda: (DRIVER.update(d="gelsd"), KANLoss(KAN([8, 16, 16, 3]), update_grid=True))[1], tab()),
    "effkan_grid_in_region_gelsd": (lambda: (DRIVER.update(d="gelsd"), KANLoss(KANGridIn([8, 16, 16, 3])))[1], tab()),
    "kan_conv": (KANConvNet, lambda s: (torch.randn(4, 1, 8, 8, generator=gen(s)), torch.randint(0, 3, (4,), generator=gen(s)))),
    "pykan_multkan": (pykan_model, tab()),
}

if __name__ == "__main__":
    raise SystemExit(run(Z))
