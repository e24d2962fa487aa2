"""Sweep: the model changes between (and within) steps while the runtime is entered.

Each case trains a model plainly and under each of keep, recompute, offload, auto,
auto_tight (half keep's step-0 peak) and auto_serve (same, replay_op_us=0) from identical
deep copies and seeds, with the same surgery at the same step, 10 steps (SGD lr 0.05
unless said), and compares bitwise every gradient, parameter, buffer, loss (and input
grad) at every step plus the final state_dict (harness.py). Books: one record per
optimizer step; recompute replays every step; offload offloads every step; auto_tight /
auto_serve planned steps within 1.05x budget (else FAIL-BOOKS, marked [SILENT] when no
budget warning was logged).

Models: Net = Linear in, ModuleList of 4 Blocks (LayerNorm, fc1 D->2D, GELU, Dropout 0.1,
fc2, residual; a block casts its input to its own weight dtype and back), head, square
mean loss; D=32, batch (4,8,32). TokNet = Embedding(50,32), 3 Blocks, head Linear(32,50),
cross-entropy. ConvNet = conv stem, 3 ConvBlocks (conv, BN, relu, conv, residual), head.

Cases (k = step of the change):
 freeze_block          blocks[1].requires_grad_(False) at 4, back to True at 7
 freeze_embedding      TokNet: emb frozen at 4
 freeze_prefix         inp, blocks[0], blocks[1] frozen at 4 (block 0 and 1 save nothing)
 unfreeze_progressive  blocks 0-2 frozen from the start; one unfrozen at each of 3, 4, 5
 freeze_between_fb     at 4: blocks[2].fc1.weight.requires_grad_(False) between forward and
                       backward (torch: no grad accumulated), restored at 5
 unfreeze_between_fb   blocks[2].fc1.weight frozen from the start; at 4 unfrozen between
                       forward and backward (torch: no grad that step)
 freeze_between_micro  accumulation 2; at 4 blocks[1] frozen after micro-batch 0's backward,
                       unfrozen before step 5
 append_block          blocks.append(Block()) at 4, optimizer rebuilt
 delete_block          del blocks[2] at 4
 reorder_blocks        blocks[0], blocks[2] swapped (ModuleList setitem) at 4
 lora_replace          blocks[1].fc1 = LoRA(blocks[1].fc1) (PEFT-like; base frozen) at 4
 replace_block         blocks[2] = fresh Block() at 4
 wrap_block            blocks[1] = Wrapper(blocks[1]) at 4
 rebind_same_blocks    model.blocks = nn.ModuleList(list(model.blocks)) at 4 (same blocks)
 rebind_new_blocks     model.blocks = nn.ModuleList(deepcopies) at 4
 add_heads             model.heads = ModuleDict of two Linear heads at 4 (used in the loss)
 layerdrop_each_step   LayerDrop 0.4 on the blocks (drawn in the root forward) every step
 layerdrop_from_k      LayerDrop 0.5 switched on at 4
 replace_block_between blocks[1] replaced by a modified deepcopy between forward and
                       backward at 4
 load_state_same       at 4, load_state_dict of a state taken at step 1 (strict)
 load_state_partial    at 4, load_state_dict(strict=False) of blocks.1.* from a fresh model
 new_param_object      blocks[1].fc1.weight = nn.Parameter(w * 0.5) at 4, optimizer rebuilt
 new_param_frozen      blocks[1].fc1.weight = nn.Parameter(w, requires_grad=False) at 4
                       (same slot name), optimizer rebuilt
 new_param_between_fb  blocks[1].fc1.weight = nn.Parameter(w.clone()) between forward and
                       backward at 4, optimizer rebuilt after
 data_same_shape       blocks[1].fc1.weight.data = new tensor (same shape) at 4
 data_diff_shape       blocks[1] hidden width 64 -> 128 through .data of fc1.weight/bias and
                       fc2.weight at 4 (more activation bytes, same signature)
 tie_weights           TokNet: head.weight = emb.weight at 4, optimizer rebuilt
 prune                 prune.l1_unstructured(blocks[1].fc1, 'weight', 0.3) at 4,
                       prune.remove at 7, optimizer rebuilt each time
 weight_norm           parametrizations.weight_norm(blocks[1].fc2) at 4
 spectral_norm_hook    nn.utils.spectral_norm(blocks[1].fc2) (old hook API) at 4
 parametrize_custom    register_parametrization(blocks[1].fc1, 'weight', Scale2) at 4
 fuse_conv_bn          ConvNet: each block's conv1+bn1 fused (fuse_conv_bn_eval) at 4,
                       bn1 -> Identity
 eval_forward_in_step  at 4..5: model.eval(); l1 = model(x'); model.train(); (l1 + model(x))
                       one backward
 dropout_p_change      blocks[1].drop.p = 0.6 at 4
 to_float64            model.double() at 4 (inputs double)
 to_bfloat16           model.bfloat16() at 4 (inputs bf16)
 block_to_float64      blocks[2].double() at 4 (the block casts its input; signature's
                       dtype is the first parameter's)
 channels_last         ConvNet .to(channels_last) at 4 (inputs channels_last)
 compile_block         blocks[1].compile(backend="aot_eager") in place at 4
 input_grad_from_k     input requires grad from step 4
 new_optimizer         Adam created at 4 (SGD before)
 add_param_group       optimizer over blocks only; head+inp group added at 4
 zero_grad_alternate   zero_grad(set_to_none=False) on even steps, True on odd
 accum_change          accumulation 1 -> 3 at 4 -> 2 at 7
 swap_act_module       blocks[1].act = nn.SiLU() (was nn.GELU) at 4: other ops, same saves' sizes
 gate_flag             blocks[1].gate = True (plain bool attribute; adds h * sigmoid(h)) at 4
 act_name_str          blocks[1].act_name = "silu" (plain str attribute; F.silu instead of GELU)
 block_to_bf16         blocks[2].bfloat16() at 4 (block casts its input)
 lora_between_micro    accumulation 2; at 4 LoRA put on blocks[1].fc1 after micro-batch 0's
                       backward (optimizer rebuilt before the step)
 gate_between_micro    accumulation 2; at 4 blocks[1].gate = True after micro-batch 0
 swap_act_between_fb   at 4, blocks[1].act = nn.SiLU() between forward and backward
 lora_between_fb       at 4, LoRA put on blocks[1].fc1 between forward and backward
 gate_between_fb       at 4, blocks[1].gate = True between forward and backward (documented:
                       a plain module attribute changed between forward and backward)
 data_between_fb       at 4, blocks[1].fc1.weight.data = w * 0.5 between forward and backward
                       (documented: a write through .data after a save)
 load_state_assign     at 4, load_state_dict(sd * 0.9, assign=True): new Parameter objects
 resize_embedding      TokNet: emb replaced by a larger Embedding (vocab 50 -> 60) at 4

Run (one process per group, each under 3 minutes):
  cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zb/sweep_changes.py \
      CASE[,CASE...]|all|group:N [VARIANT,...] > docs/results/cpu-2026-12-05zb/out_X.txt
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py
from harness import (  # noqa: E402
    V, VARIANTS, Block, Case, ConvNet, Net, TokNet, img_batch, run_case, tok_batch,
)


def rebuild_opt(m, ctx):
    ctx.opt = ctx.case.make_opt(m)


def at(k, fn, rebuild=False):
    def before(m, step, ctx):
        if step == k:
            torch.manual_seed(777)
            fn(m, ctx)
            if rebuild:
                rebuild_opt(m, ctx)
    return before


def seq(*fns):
    def before(m, step, ctx):
        for f in fns:
            f(m, step, ctx)
    return before


class LoRA(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 4) -> None:
        super().__init__()
        self.base = base
        base.requires_grad_(False)
        self.A = nn.Linear(base.in_features, r, bias=False)
        self.B = nn.Linear(r, base.out_features, bias=False)
        nn.init.normal_(self.B.weight, std=0.02)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.base(x) + self.B(self.A(self.drop(x))) * 2.0


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.inner(x) * self.scale


class Scale2(nn.Module):
    def forward(self, w):
        return w * 0.5 + w.tanh() * 0.1


def freeze(mods, flag):
    for mm in mods:
        mm.requires_grad_(flag)


CASES: list[Case] = []


def case(**kw):
    CASES.append(Case(**kw))


# ---------------------------------------------------------------- freezing
case(name="freeze_block", doc="", before=seq(at(4, lambda m, c: m.blocks[1].requires_grad_(False)),
                                           at(7, lambda m, c: m.blocks[1].requires_grad_(True))))
case(name="freeze_embedding", doc="", build=TokNet, batch=tok_batch,
     before=at(4, lambda m, c: m.emb.requires_grad_(False)))
case(name="freeze_prefix", doc="", before=at(4, lambda m, c: freeze([m.inp, m.blocks[0], m.blocks[1]], False)))


def _unfreeze_prog_build():
    torch.manual_seed(0)
    m = Net()
    freeze(m.blocks[:3], False)
    return m


case(name="unfreeze_progressive", doc="", build=_unfreeze_prog_build,
     before=lambda m, s, c: m.blocks[s - 3].requires_grad_(True) if s in (3, 4, 5) else None)


def _fb_freeze(m, step, mi, ctx):
    if step == 4:
        m.blocks[2].fc1.weight.requires_grad_(False)


case(name="freeze_between_fb", doc="", between=_fb_freeze,
     before=at(5, lambda m, c: m.blocks[2].fc1.weight.requires_grad_(True)))


def _unfrozen_w_build():
    torch.manual_seed(0)
    m = Net()
    m.blocks[2].fc1.weight.requires_grad_(False)
    return m


case(name="unfreeze_between_fb", doc="", build=_unfrozen_w_build,
     between=lambda m, s, mi, c: m.blocks[2].fc1.weight.requires_grad_(True) if s == 4 else None)


def _accum2(m, step, ctx):
    ctx.accum = 2
    if step == 5:
        m.blocks[1].requires_grad_(True)


case(name="freeze_between_micro", doc="", before=_accum2,
     after_backward=lambda m, s, mi, c: m.blocks[1].requires_grad_(False) if (s == 4 and mi == 0) else None)

# ---------------------------------------------------------------- structure
case(name="append_block", doc="documented: a block appended beside the regions runs plainly (kept), named once", before=at(4, lambda m, c: m.blocks.append(Block()), rebuild=True))
case(name="delete_block", doc="", before=at(4, lambda m, c: m.blocks.__delitem__(2), rebuild=True))


def _swap(m, c):
    b0, b2 = m.blocks[0], m.blocks[2]
    m.blocks[0] = b2
    m.blocks[2] = b0


case(name="reorder_blocks", doc="", before=at(4, _swap))
case(name="lora_replace", doc="", before=at(4, lambda m, c: setattr(m.blocks[1], "fc1", LoRA(m.blocks[1].fc1)), rebuild=True))
case(name="replace_block", doc="documented: a region replaced while entered is not followed; the new block runs plainly, named", before=at(4, lambda m, c: m.blocks.__setitem__(2, Block()), rebuild=True))
case(name="wrap_block", doc="", before=at(4, lambda m, c: m.blocks.__setitem__(1, Wrapper(m.blocks[1])), rebuild=True))
case(name="rebind_same_blocks", doc="", before=at(4, lambda m, c: setattr(m, "blocks", nn.ModuleList(list(m.blocks)))))
case(name="rebind_new_blocks", doc="documented: model.blocks = ... (regions replaced) not followed; new blocks run plainly, named", before=at(4, lambda m, c: setattr(m, "blocks", nn.ModuleList(copy.deepcopy(list(m.blocks)))), rebuild=True))
case(name="add_heads", doc="", before=at(4, lambda m, c: setattr(m, "heads", nn.ModuleDict({"a": nn.Linear(32, 8), "b": nn.Linear(32, 4)})), rebuild=True))
case(name="layerdrop_each_step", doc="", regions_gone=True, before=at(0, lambda m, c: setattr(m, "layerdrop", 0.4)))
case(name="layerdrop_from_k", doc="", regions_gone=True, before=at(4, lambda m, c: setattr(m, "layerdrop", 0.5)))


def _replace_between(m, step, mi, ctx):
    if step == 4:
        nb = copy.deepcopy(m.blocks[1])
        with torch.no_grad():
            nb.fc1.weight.mul_(2)
        m.blocks[1] = nb
        ctx.store["rebuild"] = True


def _rebuild_if(m, step, ctx):
    if ctx.store.pop("rebuild", False):
        rebuild_opt(m, ctx)


case(name="replace_block_between", doc="documented: a region replaced while entered runs plainly from then on, named", between=_replace_between, before=_rebuild_if)

# ---------------------------------------------------------------- state


def _save_at1(m, step, ctx):
    if step == 1:
        ctx.store["sd"] = copy.deepcopy(m.state_dict())
    if step == 4:
        m.load_state_dict(ctx.store["sd"])


case(name="load_state_same", doc="", before=_save_at1)


def _load_partial(m, c):
    torch.manual_seed(5)
    fresh = Net()
    sd = {k: v for k, v in fresh.state_dict().items() if k.startswith("blocks.1.")}
    m.load_state_dict(sd, strict=False)


case(name="load_state_partial", doc="", before=at(4, _load_partial))
case(name="new_param_object", doc="", before=at(4, lambda m, c: setattr(m.blocks[1].fc1, "weight", nn.Parameter(m.blocks[1].fc1.weight.detach() * 0.5)), rebuild=True))
case(name="new_param_frozen", doc="", before=at(4, lambda m, c: setattr(m.blocks[1].fc1, "weight", nn.Parameter(m.blocks[1].fc1.weight.detach().clone(), requires_grad=False)), rebuild=True))


def _newp_between(m, step, mi, ctx):
    if step == 4:
        m.blocks[1].fc1.weight = nn.Parameter(m.blocks[1].fc1.weight.detach().clone())
        ctx.store["rebuild"] = True


case(name="new_param_between_fb", doc="", between=_newp_between, before=_rebuild_if)


def _data_same(m, c):
    w = m.blocks[1].fc1.weight
    w.data = torch.randn(w.shape) * 0.1


case(name="data_same_shape", doc="", before=at(4, _data_same))


def _data_diff(m, c):
    b = m.blocks[1]
    b.fc1.weight.data = torch.randn(128, 32) * 0.1
    b.fc1.bias.data = torch.randn(128) * 0.1
    b.fc2.weight.data = torch.randn(32, 128) * 0.1
    b.fc1.out_features = 128
    b.fc2.in_features = 128


case(name="data_diff_shape", doc="", before=at(4, _data_diff))
case(name="tie_weights", doc="", build=TokNet, batch=tok_batch,
     before=at(4, lambda m, c: setattr(m.head, "weight", m.emb.weight), rebuild=True))
case(name="prune", doc="", before=seq(at(4, lambda m, c: prune.l1_unstructured(m.blocks[1].fc1, "weight", 0.3), rebuild=True),
                                    at(7, lambda m, c: prune.remove(m.blocks[1].fc1, "weight"), rebuild=True)))
case(name="weight_norm", doc="", before=at(4, lambda m, c: torch.nn.utils.parametrizations.weight_norm(m.blocks[1].fc2), rebuild=True))
case(name="spectral_norm_hook", doc="", before=at(4, lambda m, c: torch.nn.utils.spectral_norm(m.blocks[1].fc2), rebuild=True))
case(name="parametrize_custom", doc="", before=at(4, lambda m, c: torch.nn.utils.parametrize.register_parametrization(m.blocks[1].fc1, "weight", Scale2()), rebuild=True))


def _fuse(m, c):
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    for b in m.blocks:
        b.eval()
        b.conv1 = fuse_conv_bn_eval(b.conv1, b.bn1)
        b.bn1 = nn.Identity()
        b.train()


case(name="fuse_conv_bn", doc="", build=ConvNet, batch=img_batch, before=at(4, _fuse, rebuild=True))

# ---------------------------------------------------------------- modes and dtypes


def _eval_fwd(m, x, step, mi, ctx):
    if step in (4, 5):
        m.eval()
        l1 = m(x.flip(0))
        m.train()
        return l1 + m(x)
    return m(x)


case(name="eval_forward_in_step", doc="", forward=_eval_fwd)
case(name="dropout_p_change", doc="", before=at(4, lambda m, c: setattr(m.blocks[1].drop, "p", 0.6)))


def _to(dt):
    def f(m, c):
        m.to(dt)
        c.dtype = dt
    return f


case(name="to_float64", doc="budget infeasible at float64 (activations double): warned", before=at(4, _to(torch.float64)))
case(name="to_bfloat16", doc="", before=at(4, _to(torch.bfloat16)))
case(name="block_to_float64", doc="", before=at(4, lambda m, c: m.blocks[2].double()))


def _cl(m, c):
    m.to(memory_format=torch.channels_last)
    c.memfmt = torch.channels_last


case(name="channels_last", doc="", build=ConvNet, batch=img_batch, before=at(4, _cl))
case(name="compile_block", doc="", steps=8, before=at(4, lambda m, c: m.blocks[1].compile(backend="aot_eager")))
case(name="input_grad_from_k", doc="", before=at(4, lambda m, c: setattr(c, "input_grad", True)))

# ---------------------------------------------------------------- optimizer side
case(name="new_optimizer", doc="", before=at(4, lambda m, c: setattr(c, "opt", torch.optim.Adam(m.parameters(), lr=1e-3))))


def _opt_blocks(m):
    return torch.optim.SGD(m.blocks.parameters(), lr=0.05)


case(name="add_param_group", doc="", make_opt=_opt_blocks,
     before=at(4, lambda m, c: c.opt.add_param_group({"params": list(m.inp.parameters()) + list(m.head.parameters()), "lr": 0.02})))
case(name="zero_grad_alternate", doc="", before=lambda m, s, c: setattr(c, "set_to_none", s % 2 == 1))


def _accum_change(m, step, ctx):
    ctx.accum = 1 if step < 4 else (3 if step < 7 else 2)


case(name="accum_change", doc="", before=_accum_change)

# ---------------------------------------------------------------- ops changed under one signature
case(name="swap_act_module", doc="", before=at(4, lambda m, c: setattr(m.blocks[1], "act", nn.SiLU())))
case(name="gate_flag", doc="", before=at(4, lambda m, c: setattr(m.blocks[1], "gate", True)))
case(name="act_name_str", doc="", before=at(4, lambda m, c: setattr(m.blocks[1], "act_name", "silu")))
case(name="block_to_bf16", doc="", before=at(4, lambda m, c: m.blocks[2].bfloat16()))


def _lora_micro(m, step, mi, ctx):
    if step == 4 and mi == 0:
        torch.manual_seed(777)
        m.blocks[1].fc1 = LoRA(m.blocks[1].fc1)
    if step == 4 and mi == 1:
        rebuild_opt(m, ctx)


case(name="lora_between_micro", doc="", before=lambda m, s, c: setattr(c, "accum", 2), after_backward=_lora_micro)
case(name="gate_between_micro", doc="", before=lambda m, s, c: setattr(c, "accum", 2),
     after_backward=lambda m, s, mi, c: setattr(m.blocks[1], "gate", True) if (s == 4 and mi == 0) else None)

# ---------------------------------------------------------------- changes between a forward and its backward


def _between(k, fn):
    def between(m, step, mi, ctx):
        if step == k and mi == 0:
            torch.manual_seed(778)
            fn(m, ctx)
            ctx.store["rebuild"] = True
    return between


case(name="swap_act_between_fb", doc="as torch.utils.checkpoint: a submodule swapped between forward and backward replays the new one", between=_between(4, lambda m, c: setattr(m.blocks[1], "act", nn.SiLU())), before=_rebuild_if)
case(name="lora_between_fb", doc="as torch.utils.checkpoint: a submodule swapped between forward and backward replays the new one (here caught: shapes differ)", between=_between(4, lambda m, c: setattr(m.blocks[1], "fc1", LoRA(m.blocks[1].fc1))), before=_rebuild_if)
case(name="gate_between_fb", doc="documented: a plain module attribute changed between forward and backward", between=_between(4, lambda m, c: setattr(m.blocks[1], "gate", True)), before=_rebuild_if)


def _data_fb(m, c):
    w = m.blocks[1].fc1.weight
    w.data = w.detach() * 0.5


case(name="data_between_fb", doc="documented: a write through .data after a save (design.md, Writes offrecomp does not see)", between=_between(4, _data_fb), before=_rebuild_if)


def _load_assign(m, c):
    sd = {k: v.clone() * 0.9 if v.is_floating_point() else v.clone() for k, v in m.state_dict().items()}
    m.load_state_dict(sd, assign=True)


case(name="load_state_assign", doc="", before=at(4, _load_assign, rebuild=True))


def _resize_emb(m, c):
    old = m.emb
    new = nn.Embedding(V + 10, old.embedding_dim)
    with torch.no_grad():
        new.weight[:V] = old.weight
    m.emb = new


case(name="resize_embedding", doc="", build=TokNet, batch=tok_batch, before=at(4, _resize_emb, rebuild=True))

GROUPS = [CASES[i:i + 4] for i in range(0, len(CASES), 4)]

if __name__ == "__main__":
    sel = sys.argv[1] if len(sys.argv) > 1 else "all"
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else VARIANTS
    if sel == "all":
        chosen = CASES
    elif sel.startswith("group:"):
        chosen = GROUPS[int(sel[6:])]
    elif sel == "list":
        print(len(CASES), len(GROUPS), [c.name for c in CASES])
        sys.exit(0)
    else:
        names = sel.split(",")
        chosen = [c for c in CASES if c.name in names]
    bad = 0
    for c in chosen:
        r = run_case(c, variants, sys.stdout)
        bad += sum(v != "PASS" for v in r.values())
    sys.exit(1 if bad else 0)
