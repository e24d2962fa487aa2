"""torch.compile x offrecomp sweep on CPU (tiny LM of common.py: 2 blocks, h=32, dropout 0.1,
an EMA buffer, loss outside the model).  Every case trains a plain run twice (must be bitwise
equal to itself) and one run per variant (keep, recompute, offload, auto, auto_serve where
listed) from the same deep copy and seeds, 4 steps, and compares bitwise grads, params after
the optimizer step, buffers and losses; it also compares dynamo's counters (unique graphs,
graph breaks, guard failures = recompiles) with the plain run's (FLAG when they differ).

Groups (first argument; several comma-separated, or "all"):
  c1_aot / c1_ind : regional compilation with backend aot_eager / inductor:
      wrap      - model.blocks[i] = torch.compile(block) before the runtime is made
      inplace   - block.compile() before the runtime
      wrap_in   - model.blocks[i] = torch.compile(block) inside `with rt:` before step 0
      inplace_in- block.compile() inside `with rt:` before step 0
      wrap_s2   - model.blocks[i] = torch.compile(block) inside `with rt:` before step 2
      inplace_s2- block.compile() inside `with rt:` before step 2
  c2_aot / c2_ind : whole-model compilation:
      whole     - torch.compile(model); runtime given the OptimizedModule
      whole_orig- torch.compile(model); runtime given the original module
      whole_inpl- model.compile()
      whole_full- torch.compile(model, fullgraph=True)
      whole_dyn - torch.compile(model, dynamic=True), lengths 12,16,20,16 across steps
      wrap_dyn  - regional torch.compile(block, dynamic=True), lengths vary
      wrap_auto_dyn - regional torch.compile(block) (dynamic=None), lengths vary
      wrap_full - regional fullgraph=True
  c3 : compiled loss / optimizer step / attention function / compiler.disable (aot_eager
      and inductor where named):
      loss_ind       - torch.compile(loss_fn) (inductor), eager model
      loss_wrap_ind  - compiled loss + regional compiled blocks (inductor)
      optstep_sgd    - torch.compile(opt.step) (SGD, inductor), eager model
      optstep_adam   - torch.compile(opt.step) (Adam, inductor), eager model
      optstep_adam_wrap - compiled Adam step + regional blocks (aot_eager)
      attnfn_ind     - blk.attn.attn_fn = torch.compile(manual_attn) (inductor)
      attnfn_sdpa_ind- blk.attn.attn_fn = torch.compile(sdpa) (inductor)
      attnmod_inpl   - blk.attn.compile() in place (inductor): a submodule compiled
      whole_disable1 - torch.compile(model) with blocks[1].forward = torch.compiler.disable(...)
      whole_disable_mod - torch.compile(model) with blocks[1] = torch.compiler.disable(blocks[1])
  c4 : torch._functorch.config.activation_memory_budget = 0.5 (inductor; also
      aot_eager_decomp_partition), regional and whole
  c6 : exit the runtime after 2 steps, then compile and train on plainly (whole / regional);
      reenter_*: the same, then enter the same runtime again for steps 2-3;
      compile inside `with rt:` (whole model at step 0 / at step 2)

Variants (second argument, comma-separated; default keep,recompute,offload,auto,auto_serve).

Run (one group at a time keeps each run short):
  cd /tmp/sweep_compile && OMP_NUM_THREADS=1 TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_compile/inductor_cache \
      timeout 900 /work/main/.venv/bin/python sweep.py c1_aot > out_c1_aot.txt 2>&1
  (out_c6.txt was made before the reenter_* cases were added; they are in out_c6_reenter.txt:
   sweep.py c6 keep,recompute,offload,auto,auto_serve reenter; a third argument filters case names)
"""

from __future__ import annotations

import sys

from common import (
    Cfg,
    base_model,
    compare_case,
    default_check,
    lm_loss,
    manual_attn,
    sdpa,
    summary,
    torch,
)

LEN = [12, 16, 20, 16]


def wrap(backend: str, **kw):
    def f(m, call=None):
        for i, b in enumerate(m.blocks):
            m.blocks[i] = torch.compile(b, backend=backend, **kw)
        return call if call is not None else m

    return f


def inplace(backend: str, **kw):
    def f(m, call=None):
        for b in m.blocks:
            b.compile(backend=backend, **kw)
        return call if call is not None else m

    return f


def whole(backend: str, **kw):
    def f(m, call=None):
        return torch.compile(m, backend=backend, **kw)

    return f


def whole_inpl(backend: str):
    def f(m, call=None):
        m.compile(backend=backend)
        return m

    return f


def c1(backend: str) -> list[Cfg]:
    tag = "aot" if backend == "aot_eager" else "ind"
    return [
        Cfg(f"c1_{tag}_wrap", pre=wrap(backend), steps=4),
        Cfg(f"c1_{tag}_inplace", pre=inplace(backend), steps=4),
        Cfg(f"c1_{tag}_wrap_in", inside=wrap(backend), steps=4),
        Cfg(f"c1_{tag}_inplace_in", inside=inplace(backend), steps=4),
        Cfg(f"c1_{tag}_wrap_s2", at_step=(2, wrap(backend)), steps=4),
        Cfg(f"c1_{tag}_inplace_s2", at_step=(2, inplace(backend)), steps=4),
    ]


def c2(backend: str) -> list[Cfg]:
    tag = "aot" if backend == "aot_eager" else "ind"
    return [
        Cfg(f"c2_{tag}_whole", pre=whole(backend), steps=4),
        Cfg(f"c2_{tag}_whole_orig", pre=whole(backend), rt_on="orig", steps=4),
        Cfg(f"c2_{tag}_whole_inpl", pre=whole_inpl(backend), steps=4),
        Cfg(f"c2_{tag}_whole_full", pre=whole(backend, fullgraph=True), steps=4),
        Cfg(f"c2_{tag}_whole_dyn", pre=whole(backend, dynamic=True), lengths=LEN, steps=4),
        Cfg(f"c2_{tag}_wrap_dyn", pre=wrap(backend, dynamic=True), lengths=LEN, steps=4),
        Cfg(f"c2_{tag}_wrap_auto_dyn", pre=wrap(backend), lengths=LEN, steps=4),
        Cfg(f"c2_{tag}_wrap_full", pre=wrap(backend, fullgraph=True), steps=4),
    ]


def attn_fn(fn, backend):
    def f(m, call=None):
        c = torch.compile(fn, backend=backend)
        for b in m.blocks:
            b.attn.attn_fn = c
        return m

    return f


def attn_inplace(backend):
    def f(m, call=None):
        for b in m.blocks:
            b.attn.compile(backend=backend)
        return m

    return f


def whole_disable_forward(backend):
    def f(m, call=None):
        m.blocks[1].forward = torch.compiler.disable(m.blocks[1].forward)
        return torch.compile(m, backend=backend)

    return f


def whole_disable_module(backend):
    def f(m, call=None):
        m.blocks[1] = torch.compiler.disable(m.blocks[1])
        return torch.compile(m, backend=backend)

    return f


def c3() -> list[Cfg]:
    closs = torch.compile(lm_loss, backend="inductor")
    return [
        Cfg("c3_loss_ind", loss=closs, steps=4),
        Cfg("c3_loss_wrap_ind", loss=closs, pre=wrap("inductor"), steps=4),
        Cfg("c3_optstep_sgd", compile_opt={"backend": "inductor"}, steps=4),
        Cfg("c3_optstep_adam", compile_opt={"backend": "inductor"}, optimizer="adam", steps=4),
        Cfg("c3_optstep_adam_wrap", compile_opt={"backend": "aot_eager"}, optimizer="adam", pre=wrap("aot_eager"), steps=4),
        Cfg("c3_attnfn_ind", pre=attn_fn(manual_attn, "inductor"), steps=4),
        Cfg("c3_attnfn_sdpa_ind", pre=attn_fn(sdpa, "inductor"), steps=4),
        Cfg("c3_attnmod_inpl", pre=attn_inplace("inductor"), steps=4),
        Cfg("c3_whole_disable1", pre=whole_disable_forward("aot_eager"), steps=4),
        Cfg("c3_whole_disable_mod", pre=whole_disable_module("aot_eager"), steps=4),
    ]


def c4() -> list[Cfg]:
    amb = {"activation_memory_budget": 0.5}
    return [
        Cfg("c4_wrap_ind_amb", pre=wrap("inductor"), functorch_cfg=amb, steps=4),
        Cfg("c4_inplace_ind_amb", pre=inplace("inductor"), functorch_cfg=amb, steps=4),
        Cfg("c4_whole_ind_amb", pre=whole("inductor"), functorch_cfg=amb, steps=4),
        Cfg("c4_wrap_adp_amb", pre=wrap("aot_eager_decomp_partition"), functorch_cfg=amb, steps=4),
        Cfg("c4_wrap_adp_amb01", pre=wrap("aot_eager_decomp_partition"), functorch_cfg={"activation_memory_budget": 0.1}, steps=4),
    ]


def c6() -> list[Cfg]:
    return [
        Cfg("c6_exit_then_whole", after=whole("aot_eager"), split=2, steps=4),
        Cfg("c6_exit_then_wrap", after=wrap("aot_eager"), split=2, steps=4),
        Cfg("c6_exit_then_inplace", after=inplace("aot_eager"), split=2, steps=4),
        Cfg("c6_reenter_wrap", after=wrap("aot_eager"), split=2, reenter=True, steps=4),
        Cfg("c6_reenter_inplace", after=inplace("aot_eager"), split=2, reenter=True, steps=4),
        Cfg("c6_reenter_whole", after=whole("aot_eager"), split=2, reenter=True, steps=4),
        Cfg("c6_whole_in", inside=whole("aot_eager"), steps=4),
        Cfg("c6_whole_s2", at_step=(2, whole("aot_eager")), steps=4),
        Cfg("c6_whole_inpl_in", inside=whole_inpl("aot_eager"), steps=4),
        Cfg("c6_whole_ind_in", inside=whole("inductor"), steps=4),
    ]


GROUPS = {
    "c1_aot": lambda: c1("aot_eager"),
    "c1_ind": lambda: c1("inductor"),
    "c2_aot": lambda: c2("aot_eager"),
    "c2_ind": lambda: c2("inductor"),
    "c3": c3,
    "c4": c4,
    "c6": c6,
}


def main() -> int:
    groups = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else list(GROUPS)
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["keep", "recompute", "offload", "auto", "auto_serve"]
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    results: list[tuple[str, str, str]] = []
    base = base_model()
    for g in groups:
        for cfg in GROUPS[g]():
            if only and not any(o in cfg.name for o in only):
                continue
            print(f"== {cfg.name}", flush=True)
            compare_case(base, cfg, variants, results, default_check)
    summary(results)
    return 1 if any(s != "PASS" for _, _, s in results) else 0


if __name__ == "__main__":
    sys.exit(main())
