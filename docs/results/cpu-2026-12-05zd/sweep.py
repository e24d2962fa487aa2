"""Sweep: does auto keep its memory promise? Budgets against the allocator's own peak.

For every case: plain training (8 steps), mode="keep" and mode="recompute" (4 steps
each; books = the runtime's peak_activation_bytes of the last step, allocator peak =
median over steps 1-3), torch.utils.checkpoint per block where easy (4 steps), then
mode="auto" at budgets B = recompute_books + f * (keep_books - recompute_books) for
f in 0.3, 0.5, 0.75 (8 steps each). Every step's allocator peak is measured with
torch.profiler(profile_memory=True) around the step's forward(s)+backward(s) (the
tests' allocator_peak). Each auto step's gradients are compared bitwise with plain's.

Per planned step the table gives: books (peak_activation_bytes), pred (predicted_peak_bytes),
alloc (allocator peak), keep-(Kb-B) = keep's allocator peak minus (keep's books - B)
(what the step may hold if auto saves what its books say), ratio alloc/that,
rec+(B-Rb) = the documented bound (reliability.md, Resource faults: recompute's
allocator peak + (B - recompute's books) + 5% of B), hidden = alloc - (keep_alloc -
keep_books + books) (memory above what the books imply), bitwise grads, and flags:
  BOOKS>B_SILENT            books > 1.05 B with no warning logged so far in the run
  books>B(within5%)         books in (B, 1.05 B], no warning (documented margin)
  ALLOC>KEEP-SAVING_SILENT  alloc > 1.05 * (keep_alloc - (keep_books - B)), no warning
  alloc>rec-bound           alloc above the documented bound from recompute
  warn-on-fine-step         a "planned step held" warning at a step within B
  GRADS_DIFF                gradients differ from plain

Cases (name: what):
  gpt            tests/models.GPT(6 layers, h=64, dropout 0.1), idx (4,128)
  gpt_nodrop     same, p=0, min_bytes=0
  gpt_deep       GPT 12 layers h=48, idx (4,96)
  mlp_stack      Stack of 8 MLPBlock(h=256), x (256,256)
  mlp_small      test_budgets' _mlp_blocks (storages under min_bytes), x (32,64)
  vit            ViT: conv patch embed, 6 pre-LN blocks (nn.MultiheadAttention), (8,3,32,32)
  resnet_bn      ResNet-ish: BasicBlocks with BatchNorm in a ModuleList, (8,3,32,32)
  cnn_bn         tests/models.CNN, (8,3,32,32)
  unet           U-Net: 3 down blocks, 3 up blocks concatenating the down skips
  lstm_stack     4 blocks of LSTM + LayerNorm + Linear residual, (8,64,64)
  gru_stack      4 blocks of GRU + Linear residual, (8,64,64)
  encdec         3 nn.TransformerEncoderLayer + 3 nn.TransformerDecoderLayer (cross-attn), dropout 0.1
  moe            4 blocks of top-1 routed MLP experts (data-dependent sizes)
  tied_lm        tied embedding/LM head vocab 4096, 4 small blocks, big logits+loss at the root
  big_root       a wide MLP (64->2048->64) at the root, outside regions, then 4 MLP blocks
  accum2         gpt with 2 micro-batches per step
  bf16           gpt under bf16 autocast
  twice          tests/models.SharedModel(h=64) (a block called twice per forward), (4,64,64)
  kw_tuple       tests/models.KwModel(h=128), (8,64,128)
  inplace        tests/models.InplaceModel(h=128), (8,64,128)
  densenet       test_budgets' _DenseNet (feature maps every later layer takes), (8,3,16,16)
  convnext       ConvNeXt-like blocks (depthwise 7x7 conv, LayerNorm, GELU MLP), (8,32,16,16)
  hf_gpt2        transformers GPT2LMHeadModel from config (4 layers, 64 wide), use_cache=False
  hf_llama       transformers LlamaForCausalLM from config (4 layers, 64 wide), use_cache=False
  hf_bert        transformers BertForMaskedLM from config (4 layers, 64 wide)
  hf_t5          transformers T5ForConditionalGeneration from config (3+3 layers, 64 wide)
 round 2 (adversarial):
  narrow_out     blocks returning a narrow view of a 4x wider saved tensor, (1024,128)
  ctx_attr       blocks with a custom autograd.Function keeping tensors as ctx attributes
  stages         3 stages x 4 MLP blocks (the stages are the regions)
  deep_sup       a loss head at the root on every block's output
  dyn_len        gpt with the sequence length changing per step (borrowed plans), 10 steps
  gpt_h32        GPT h=32: most storages under the default min_bytes
  emul_offload   gpt with d2h/h2d 1000 GB/s asserted (CPU: emulated offload)
  bf16_gru       gru_stack under bf16 autocast
  accum2_bf16_llama  hf_llama, bf16 autocast, 2 micro-batches
  cell_loop      4 regions each running an nn.LSTMCell over 32 steps itself, fp32
  bf16_cell_loop the same under bf16 autocast
  ema_buffers    6 MLP blocks each reading and updating a 1 MiB buffer in forward

Command (each case in its own process, one at a time; SWEEP_OUT names another output folder):
  cd REPO && for c in <case names above>; do
    OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/sweep.py $c
  done
  cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/summarize.py > docs/results/cpu-2026-12-05zd/out/summary.txt
Results: out/<case>.txt (table), out/<case>.json (all numbers), in this folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root (offrecomp, tests.models)
if str(HERE) not in sys.path:
    sys.path.insert(1, str(HERE))  # harness
from tests import models  # noqa: E402

from harness import Case, ckpt_children, sweep_case  # noqa: E402


def gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


# ---------------------------------------------------------------- models
class ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, d: int = 96, depth: int = 6, patch: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 65, d) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(d, 4) for _ in range(depth))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = xy
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
        for b in self.blocks:
            t = b(t)
        return F.cross_entropy(self.head(self.ln(t[:, 0])), y)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        cfg = [(16, 16, 1), (16, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]
        self.blocks = nn.ModuleList(BasicBlock(a, b, s) for a, b, s in cfg)
        self.fc = nn.Linear(64, 10)

    def forward(self, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = xy
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.fc(x.mean((2, 3))), y)


class CNNLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = models.CNN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x)


class Down(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout)
        self.c2, self.n2 = nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(4, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.n2(self.c2(F.silu(self.n1(self.c1(x))))))


class Up(nn.Module):
    def __init__(self, cin: int, cskip: int, cout: int) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(cin + cskip, cout, 3, padding=1), nn.GroupNorm(4, cout)
        self.c2, self.n2 = nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(4, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        x = torch.cat([x, skip], 1)
        return F.silu(self.n2(self.c2(F.silu(self.n1(self.c1(x))))))


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Conv2d(3, 16, 3, padding=1)
        self.downs = nn.ModuleList([Down(16, 16), Down(16, 32), Down(32, 64)])
        self.mid = Down(64, 64)
        self.ups = nn.ModuleList([Up(64, 64, 32), Up(32, 32, 16), Up(16, 16, 16)])
        self.out = nn.Conv2d(16, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        skips = []
        for d in self.downs:
            h = d(h)
            skips.append(h)
            h = F.avg_pool2d(h, 2)
        h = self.mid(h)
        for u in self.ups:
            h = u(h, skips.pop())
        return (self.out(h) - x).square().mean()


class RNNBlock(nn.Module):
    def __init__(self, d: int, kind: str) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(d, d, batch_first=True)
        self.ff = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.ln(x))
        return x + torch.tanh(self.ff(y))


class EncDec(nn.Module):
    def __init__(self, d: int = 64, vocab: int = 128) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 4 * d, 0.1, batch_first=True) for _ in range(3))
        self.dec = nn.ModuleList(nn.TransformerDecoderLayer(d, 4, 4 * d, 0.1, batch_first=True) for _ in range(3))
        self.head = nn.Linear(d, vocab)

    def forward(self, st: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        src, tgt = st
        mem = self.emb(src)
        for layer in self.enc:
            mem = layer(mem)
        y = self.emb(tgt[:, :-1])
        mask = nn.Transformer.generate_square_subsequent_mask(y.shape[1])
        for layer in self.dec:
            y = layer(y, mem, tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(y).flatten(0, 1), tgt[:, 1:].flatten())


class MoEBlock(nn.Module):
    def __init__(self, d: int = 64, experts: int = 4) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln(x).reshape(-1, d)
        probs = torch.softmax(self.gate(h), -1)
        w, idx = probs.max(-1)
        y = torch.zeros_like(h)
        for e, ex in enumerate(self.experts):
            rows = (idx == e).nonzero().squeeze(-1)
            if rows.numel():
                y = y.index_add(0, rows, ex(h[rows]) * w[rows, None])
        return x + y.reshape(b, t, d)


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 4096, d: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(models.MLPBlock(d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.ln(x) @ self.emb.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten())


class BigRoot(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.pre1, self.pre2 = nn.Linear(d, 2048), nn.Linear(2048, d)
        self.blocks = nn.ModuleList(models.MLPBlock(d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pre2(F.gelu(self.pre1(x)))
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


class Wrap(nn.Module):
    """A module that takes the batch and returns a scalar (tests.models.* that take a tensor)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = nn.LayerNorm(c)
        self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.ln(y)))).permute(0, 3, 1, 2)
        return x + y


class HF(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.m(**b).loss


def hf_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, use_cache=False)
    return HF(GPT2LMHeadModel(cfg))


def hf_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=256, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256, use_cache=False)
    return HF(LlamaForCausalLM(cfg))


def hf_bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=256, num_attention_heads=4,
                     vocab_size=1000, max_position_embeddings=256)
    return HF(BertForMaskedLM(cfg))


def hf_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(num_layers=3, num_decoder_layers=3, d_model=64, d_ff=256, num_heads=4, d_kv=16,
                   vocab_size=1000, use_cache=False, decoder_start_token_id=0)
    return HF(T5ForConditionalGeneration(cfg))


def hf_ckpt(model: nn.Module) -> None:
    model.m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def lm_batch(b: int, t: int, vocab: int = 1000):
    def f(s: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (b, t), generator=gen(s))
        return {"input_ids": ids, "labels": ids}
    return f


def t5_batch(s: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 1000, (8, 64), generator=gen(s)),
            "labels": torch.randint(0, 1000, (8, 32), generator=gen(s + 5000))}


def img_batch(b: int, c: int, hw: int):
    return lambda s: (torch.randn(b, c, hw, hw, generator=gen(s)), torch.randint(0, 10, (b,), generator=gen(s)))


def dense() -> nn.Module:
    from tests.offrecomp.test_budgets import _DenseNet
    return _DenseNet()


def mlp_small() -> nn.Module:
    blocks = [nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.GELU()) for _ in range(8)]
    return models.Stack(blocks)


CASES: dict[str, Case] = {}


def add(c: Case) -> None:
    CASES[c.name] = c


tok = lambda b, t, v=64: (lambda s: torch.randint(0, v, (b, t), generator=gen(s)))  # noqa: E731
add(Case("gpt", lambda: models.GPT(layers=6, h=64, heads=4, p=0.1), tok(4, 128), ckpt=ckpt_children("blocks"), note="GPT dropout"))
add(Case("gpt_nodrop", lambda: models.GPT(layers=6, h=64, heads=4, p=0.0), tok(4, 128), opts={"min_bytes": 0}, ckpt=ckpt_children("blocks"), note="GPT p=0, min_bytes=0"))
add(Case("gpt_deep", lambda: models.GPT(layers=12, h=48, heads=4, p=0.1), tok(4, 96), ckpt=ckpt_children("blocks"), note="GPT 12 layers"))
add(Case("mlp_stack", lambda: models.Stack([models.MLPBlock(256) for _ in range(8)]), lambda s: torch.randn(256, 256, generator=gen(s)), ckpt=ckpt_children("blocks"), note="8 MLP blocks"))
add(Case("mlp_small", mlp_small, lambda s: torch.randn(32, 64, generator=gen(s)), ckpt=ckpt_children("blocks"), note="small storages under min_bytes"))
add(Case("vit", ViT, img_batch(8, 3, 32), ckpt=ckpt_children("blocks"), note="ViT MHA dropout"))
add(Case("resnet_bn", ResNet, img_batch(8, 3, 32), ckpt=ckpt_children("blocks"), note="ResNet BatchNorm"))
add(Case("cnn_bn", CNNLoss, lambda s: torch.randn(8, 3, 32, 32, generator=gen(s)), ckpt=ckpt_children("m.features"), note="tests CNN BatchNorm"))
add(Case("unet", UNet, lambda s: torch.randn(4, 3, 32, 32, generator=gen(s)), ckpt=ckpt_children("downs,ups"), note="U-Net skips"))
add(Case("lstm_stack", lambda: models.Stack([RNNBlock(64, "lstm") for _ in range(4)]), lambda s: torch.randn(8, 64, 64, generator=gen(s)), ckpt=ckpt_children("blocks"), note="LSTM stack"))
add(Case("gru_stack", lambda: models.Stack([RNNBlock(64, "gru") for _ in range(4)]), lambda s: torch.randn(8, 64, 64, generator=gen(s)), ckpt=ckpt_children("blocks"), note="GRU stack"))
add(Case("encdec", EncDec, lambda s: (torch.randint(0, 128, (8, 64), generator=gen(s)), torch.randint(0, 128, (8, 48), generator=gen(s + 7))), ckpt=ckpt_children("enc,dec"), note="enc-dec cross-attn"))
add(Case("moe", lambda: models.Stack([MoEBlock() for _ in range(4)]), lambda s: torch.randn(8, 64, 64, generator=gen(s)), ckpt=ckpt_children("blocks"), steps=10, note="top-1 MoE, data-dependent"))
add(Case("tied_lm", TiedLM, tok(4, 128, 4096), ckpt=ckpt_children("blocks"), note="tied emb, big LM head at root"))
add(Case("big_root", BigRoot, lambda s: torch.randn(512, 64, generator=gen(s)), ckpt=ckpt_children("blocks"), note="big root activations"))
add(Case("accum2", lambda: models.GPT(layers=6, h=64, heads=4, p=0.1), tok(4, 128), accumulate=2, ckpt=ckpt_children("blocks"), note="GPT, 2 micro-batches"))
add(Case("bf16", lambda: models.GPT(layers=6, h=64, heads=4, p=0.1), tok(4, 128), autocast=True, ckpt=ckpt_children("blocks"), note="GPT bf16 autocast"))
add(Case("twice", lambda: Wrap(models.SharedModel(h=64)), lambda s: torch.randn(4, 64, 64, generator=gen(s)), note="block called twice"))
add(Case("kw_tuple", lambda: Wrap(models.KwModel(h=128)), lambda s: torch.randn(8, 64, 128, generator=gen(s)), note="kw tensors, tuple outputs"))
add(Case("inplace", lambda: Wrap(models.InplaceModel(h=128)), lambda s: torch.randn(8, 64, 128, generator=gen(s)), ckpt=ckpt_children("m.blocks"), note="views, in-place"))
add(Case("densenet", dense, lambda s: torch.randn(8, 3, 16, 16, generator=gen(s)), ckpt=ckpt_children("layers"), note="DenseNet concat"))
add(Case("convnext", lambda: models.Stack([ConvNeXtBlock(32) for _ in range(4)]), lambda s: torch.randn(8, 32, 16, 16, generator=gen(s)), ckpt=ckpt_children("blocks"), note="ConvNeXt-like"))
add(Case("hf_gpt2", hf_gpt2, lm_batch(4, 128), ckpt=hf_ckpt, note="HF GPT2 tiny"))
add(Case("hf_llama", hf_llama, lm_batch(4, 128), ckpt=hf_ckpt, note="HF Llama tiny"))
add(Case("hf_bert", hf_bert, lm_batch(4, 128), ckpt=hf_ckpt, note="HF BERT MLM tiny"))
add(Case("hf_t5", hf_t5, t5_batch, ckpt=hf_ckpt, note="HF T5 tiny"))


# ---------------------------------------------------------------- round 2: adversarial
class NarrowOut(nn.Module):
    """Returns a view (narrow) of a 4x wider tensor its tanh saved: the next block's
    input keeps the whole storage alive."""

    def __init__(self, d: int = 128) -> None:
        super().__init__()
        self.ln, self.fc, self.d = nn.LayerNorm(d), nn.Linear(d, 4 * d), d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(self.ln(x))).narrow(-1, 0, self.d)


class CtxAttr(torch.autograd.Function):
    """Saves its input as a ctx attribute (not save_for_backward): no saved-tensor hook sees it."""

    @staticmethod
    def forward(ctx, x, w):  # type: ignore[override]
        ctx.x, ctx.w = x, w
        return x @ w

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g @ ctx.w.t(), ctx.x.flatten(0, -2).t() @ g.flatten(0, -2)


class CtxBlock(nn.Module):
    def __init__(self, d: int = 128) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(d, 4 * d) / d ** 0.5)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(CtxAttr.apply(x, self.w1)))


class Stages(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList(nn.Sequential(*[models.MLPBlock(128) for _ in range(4)]) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for s in self.stages:
            x = s(x)
        return x.square().mean()


class DeepSup(nn.Module):
    """Every block's output feeds a loss head at the root (deep supervision): the root
    saves each block's output."""

    def __init__(self, d: int = 128) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(models.MLPBlock(d) for _ in range(6))
        self.heads = nn.ModuleList(nn.Linear(d, 64) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        loss = x.new_zeros(())
        for b, h in zip(self.blocks, self.heads):
            x = b(x)
            loss = loss + torch.logsumexp(h(x), -1).mean()
        return loss


LENS = [128, 128, 96, 128, 64, 112, 128, 80, 128, 96]


def dyn_tok(s: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, LENS[(s // 10) % len(LENS)]), generator=gen(s))


add(Case("narrow_out", lambda: models.Stack([NarrowOut() for _ in range(6)]), lambda s: torch.randn(1024, 128, generator=gen(s)), ckpt=ckpt_children("blocks"), note="block output is a narrow view of a saved 4x storage"))
add(Case("ctx_attr", lambda: models.Stack([CtxBlock() for _ in range(6)]), lambda s: torch.randn(1024, 128, generator=gen(s)), ckpt=ckpt_children("blocks"), note="custom Function saving ctx attributes"))
add(Case("stages", Stages, lambda s: torch.randn(1024, 128, generator=gen(s)), ckpt=ckpt_children("stages"), note="3 stages x 4 MLP blocks (stages are regions)"))
add(Case("deep_sup", DeepSup, lambda s: torch.randn(1024, 128, generator=gen(s)), ckpt=ckpt_children("blocks"), note="root loss head on every block output"))
add(Case("dyn_len", lambda: models.GPT(layers=6, h=64, heads=4, p=0.1), dyn_tok, steps=10, ckpt=ckpt_children("blocks"), note="GPT, seq len varies per step (borrowed plans)"))
add(Case("gpt_h32", lambda: models.GPT(layers=6, h=32, heads=4, p=0.1), tok(4, 96), ckpt=ckpt_children("blocks"), note="GPT h=32: most storages under default min_bytes"))
add(Case("emul_offload", lambda: models.GPT(layers=6, h=64, heads=4, p=0.1), tok(4, 128), opts={"d2h_gbps": 1000.0, "h2d_gbps": 1000.0}, note="GPT, fast link asserted on CPU (emulated offload)"))
add(Case("bf16_gru", lambda: models.Stack([RNNBlock(64, "gru") for _ in range(4)]), lambda s: torch.randn(8, 64, 64, generator=gen(s)), autocast=True, ckpt=ckpt_children("blocks"), note="GRU stack under bf16 autocast"))
add(Case("accum2_bf16_llama", hf_llama, lm_batch(4, 128), accumulate=2, autocast=True, ckpt=hf_ckpt, note="HF Llama, bf16, 2 micro-batches"))


class CellLoop(nn.Module):
    """A region that runs an LSTMCell over the time steps itself (a hand-written RNN layer)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[0], x.shape[2])
        outs = []
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            outs.append(h)
        return self.ln(x + torch.stack(outs, 1))


add(Case("cell_loop", lambda: models.Stack([CellLoop() for _ in range(4)]), lambda s: torch.randn(8, 32, 64, generator=gen(s)), ckpt=ckpt_children("blocks"), note="LSTMCell loop inside each region, fp32"))
add(Case("bf16_cell_loop", lambda: models.Stack([CellLoop() for _ in range(4)]), lambda s: torch.randn(8, 32, 64, generator=gen(s)), autocast=True, ckpt=ckpt_children("blocks"), note="LSTMCell loop inside each region, bf16 autocast"))



class EMABlock(nn.Module):
    """An MLP block keeping a 1 MiB EMA of its hidden features in a buffer (a VQ codebook
    average, a feature bank): the forward reads it and updates it in place."""

    def __init__(self, d: int = 256, k: int = 1024) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("ema", torch.zeros(k, d))  # 1 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(self.ln(x)))
        out = x + self.fc2(h) + 0.01 * self.ema.mean(0)
        if self.training:
            with torch.no_grad():
                self.ema.mul_(0.99).add_(0.01 * h[:, : self.ema.shape[1]].mean(0))
        return out


add(Case("ema_buffers", lambda: models.Stack([EMABlock() for _ in range(6)]), lambda s: torch.randn(256, 256, generator=gen(s)), ckpt=ckpt_children("blocks"), note="6 MLP blocks each updating a 1 MiB buffer in forward"))

if __name__ == "__main__":
    import os
    out = os.environ.get("SWEEP_OUT", str(HERE / "out"))
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[1:]:
        sweep_case(CASES[name], out)
