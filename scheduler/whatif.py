"""Synthetic profiles for hardware and models that are not at hand ("what-if" planning).

``gpt_profile`` builds the profile a pre-LN GPT block stack would produce, op by op, with
FLOP-derived times for matmuls and attention and HBM-bandwidth-derived times for the
elementwise ops. Saved bytes follow Korthikanti et al. (2022): per layer
``s*b*h*(34 + 5*a*s/h)`` bytes in 16-bit with 1-byte dropout masks, the ``5*a*s/h``
term gone with a fused (flash) attention kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.profile import OpRecord, Profile, RegionRecord, StorageKind, StorageRecord

__all__ = ["gpt_profile"]


@dataclass
class _Block:
    """Builds one region: ops in dispatch order and the storages they save."""

    launch_seconds: float
    ops: list[OpRecord] = field(default_factory=list)
    storages: list[StorageRecord] = field(default_factory=list)
    first_saves: dict[int, int] = field(default_factory=dict)

    def storage(self, nbytes: int, kind: StorageKind = "activation") -> int:
        producer = len(self.ops) if kind == "activation" else -1
        self.storages.append(StorageRecord(nbytes=int(nbytes), kind=kind, producer_op=producer))
        return len(self.storages) - 1

    def op(
        self,
        name: str,
        seconds: float,
        outputs: tuple[int, ...],
        *,
        skippable: bool = True,
        flops: float = 0.0,
        reads: tuple[int, ...] = (),
        sink: bool = False,
        view: bool = False,
    ) -> int:
        self.ops.append(
            OpRecord(
                name=name,
                seconds=max(seconds, self.launch_seconds),
                skippable=skippable,
                outputs=outputs,
                flops=flops,
                reads=tuple(sorted(set(reads))),
                sink=sink,
                view=view,
            )
        )
        return len(self.ops) - 1

    def saved_as_input(self, *storages: int) -> None:
        """The next op saves these storages before it is dispatched."""
        self._save(len(self.ops), storages)

    def saved_as_output(self, *storages: int) -> None:
        """The op just dispatched saved these storages (its outputs)."""
        self._save(len(self.ops), storages)

    def _save(self, position: int, storages: tuple[int, ...]) -> None:
        # position = number of ops dispatched before the save (see StorageRecord)
        for i in storages:
            s = self.storages[i]
            if i in self.first_saves:
                s.saves += 1
            else:
                self.first_saves[i] = position
                s.first_save_op = position
            s.last_save_op = max(s.last_save_op, position)

    def finish(self) -> None:
        starts = [0.0]
        for o in self.ops:
            starts.append(starts[-1] + o.seconds)
        for s in self.storages:
            s.offset_seconds = starts[min(s.first_save_op, len(self.ops))]


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} = {value!r} is invalid; accepted: an int > 0")
    return value


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} = {value!r} is invalid; accepted: a number > 0")
    return float(value)


@dataclass(frozen=True)
class _BlockSpec:
    """One GPT block's sizes and the rates its op times come from."""

    h: int
    """Hidden size."""
    a: int
    """Attention heads."""
    s: int
    """Sequence length."""
    b: int
    """Batch size."""
    d: int
    """Bytes per element of activations."""
    f: int
    """FFN multiplier."""
    flops_per_s: float
    """Achieved matmul and attention FLOP/s."""
    hbm: float
    """HBM bytes per second (elementwise ops)."""
    launch_seconds: float
    fused_attention: bool
    micro_ops: bool
    dropout: bool
    causal: bool

    @property
    def e(self) -> int:
        """Elements of one hidden-state tensor."""
        return self.s * self.b * self.h

    @property
    def rows(self) -> int:
        return self.s * self.b

    def mm(self, m_in: int, n_out: int) -> tuple[float, float]:
        """Seconds and FLOPs of a (rows x m_in) @ (m_in x n_out) matmul."""
        fl = 2.0 * self.rows * m_in * n_out
        return fl / self.flops_per_s, fl

    def mem(self, nbytes: float) -> float:
        """Seconds of an elementwise op moving ``nbytes``."""
        return nbytes / self.hbm


# reads: the ops that created the values an op consumes (the block input is no op of
# the region, so reading it lists nothing); views create nothing, so an op reading a
# view lists the view's base creator. Dropout draws random numbers: a sink.


def _layernorm(blk: _Block, g: _BlockSpec, reads: tuple[int, ...]) -> tuple[int, int]:
    """A layernorm saving its output (and with micro ops its fp32 mean/rstd per row);
    returns (output storage, op)."""
    ln = blk.storage(g.d * g.e)
    stats: tuple[int, ...] = ()
    if g.micro_ops:
        stats = (blk.storage(4 * g.rows), blk.storage(4 * g.rows))
    op = blk.op("aten::native_layer_norm", g.mem(2 * g.d * g.e), (ln, *stats), reads=reads)
    if stats:
        blk.saved_as_output(*stats)
    return ln, op


def _dropout(blk: _Block, g: _BlockSpec, op_in: int) -> int:
    """A dropout of a hidden state saving its 1-byte mask (its output is not saved)."""
    mask = blk.storage(g.e)
    op = blk.op(
        "aten::native_dropout",
        g.mem(2 * g.d * g.e + g.e),
        (-1, mask),
        skippable=False,
        reads=(op_in,),
        sink=True,
    )
    blk.saved_as_output(mask)
    return op


def _flash_attention(blk: _Block, g: _BlockSpec, qkv: int, op_qkv: int) -> tuple[int, int]:
    """Fused attention saving q, k, v as one QKV storage, its output and logsumexp;
    returns (output storage, op)."""
    b, s, h = g.b, g.s, g.h
    blk.saved_as_input(qkv)
    out = blk.storage(g.d * g.e)
    lse = blk.storage(4 * b * g.a * s)
    fl = 4.0 * b * s * s * h * (0.5 if g.causal else 1.0)
    op_ctx = blk.op(
        "aten::_scaled_dot_product_flash_attention",
        fl / g.flops_per_s,
        (out, lse),
        flops=fl,
        reads=(op_qkv,),
    )
    blk.saved_as_output(out, lse)
    return out, op_ctx


def _unfused_attention(blk: _Block, g: _BlockSpec, qkv: int, op_qkv: int) -> tuple[int, int]:
    """QK^T, softmax, dropout (with dropout on) and AV; returns (output storage, op)."""
    b, s, h, d = g.b, g.s, g.h, g.d
    scores = g.a * s * s * b
    blk.saved_as_input(qkv)
    fl = 2.0 * b * s * s * h
    op_qk = blk.op("aten::bmm", fl / g.flops_per_s, (-1,), flops=fl, reads=(op_qkv,))
    probs = blk.storage(d * scores)
    op_v_in = blk.op("aten::_softmax", g.mem(2 * d * scores), (probs,), reads=(op_qk,))
    blk.saved_as_output(probs)
    v_in = probs
    if g.dropout:
        mask = blk.storage(scores)
        dropped = blk.storage(d * scores)
        op_v_in = blk.op(
            "aten::native_dropout",
            g.mem(2 * d * scores + scores),
            (dropped, mask),
            skippable=False,
            reads=(op_v_in,),
            sink=True,
        )
        blk.saved_as_output(mask)
        v_in = dropped
    blk.saved_as_input(v_in, qkv)
    ctx = blk.storage(d * g.e)
    op_ctx = blk.op("aten::bmm", fl / g.flops_per_s, (ctx,), flops=fl, reads=(op_v_in, op_qkv))
    return ctx, op_ctx


def _attention_half(blk: _Block, g: _BlockSpec, x: int) -> tuple[int, int]:
    """Layernorm, QKV matmul, attention, output projection (output not saved), dropout,
    residual add; returns (residual storage, its op)."""
    blk.saved_as_input(x)
    ln1, op_ln1 = _layernorm(blk, g, ())
    blk.saved_as_input(ln1)
    qkv = blk.storage(3 * g.d * g.e)
    sec, fl = g.mm(g.h, 3 * g.h)
    op_qkv = blk.op("aten::addmm", sec, (qkv,), flops=fl, reads=(op_ln1,))
    if g.micro_ops:
        blk.op("aten::split", 0.0, (qkv, qkv, qkv), skippable=False, reads=(op_qkv,))
    attention = _flash_attention if g.fused_attention else _unfused_attention
    ctx, op_ctx = attention(blk, g, qkv, op_qkv)
    if g.micro_ops:
        blk.op("aten::view", 0.0, (ctx,), skippable=False, reads=(op_ctx,), view=True)
    blk.saved_as_input(ctx)
    sec, fl = g.mm(g.h, g.h)
    op_attn = blk.op("aten::addmm", sec, (-1,), flops=fl, reads=(op_ctx,))
    if g.dropout:
        op_attn = _dropout(blk, g, op_attn)
    res1 = blk.storage(g.d * g.e)
    op_res1 = blk.op("aten::add", g.mem(3 * g.d * g.e), (res1,), reads=(op_attn,))
    return res1, op_res1


def _mlp_half(blk: _Block, g: _BlockSpec, res1: int, op_res1: int) -> None:
    """Layernorm, fc1, GELU, fc2 (output not saved), dropout, residual add."""
    d, e, f = g.d, g.e, g.f
    blk.saved_as_input(res1)
    ln2, op_ln2 = _layernorm(blk, g, (op_res1,))
    blk.saved_as_input(ln2)
    fc1 = blk.storage(f * d * e)
    sec, fl = g.mm(g.h, f * g.h)
    op_fc1 = blk.op("aten::addmm", sec, (fc1,), flops=fl, reads=(op_ln2,))
    blk.saved_as_input(fc1)
    act = blk.storage(f * d * e)
    op_act = blk.op("aten::gelu", g.mem(2 * f * d * e), (act,), reads=(op_fc1,))
    blk.saved_as_input(act)
    sec, fl = g.mm(f * g.h, g.h)
    op_mlp = blk.op("aten::addmm", sec, (-1,), flops=fl, reads=(op_act,))
    if g.dropout:
        op_mlp = _dropout(blk, g, op_mlp)
    blk.op("aten::add", g.mem(3 * d * e), (-1,), reads=(op_mlp, op_res1))


def _gpt_block(g: _BlockSpec, layer: int, start_seconds: float) -> RegionRecord:
    """Region ``layers.<layer>``: one block's ops and saved storages (the block input is
    a storage of kind ``input``); backward is taken as twice the forward."""
    blk = _Block(launch_seconds=g.launch_seconds)
    x = blk.storage(g.d * g.e, kind="input")
    res1, op_res1 = _attention_half(blk, g, x)
    _mlp_half(blk, g, res1, op_res1)
    blk.finish()
    fwd = sum(o.seconds for o in blk.ops)
    return RegionRecord(
        name=f"layers.{layer}",
        call_index=0,
        start_seconds=start_seconds,
        forward_seconds=fwd,
        backward_seconds=2.0 * fwd,
        ops=blk.ops,
        storages=blk.storages,
    )


def gpt_profile(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    batch: int,
    dtype_bytes: int = 2,
    device_tflops: float,
    d2h_gbps: float,
    h2d_gbps: float,
    mfu: float = 0.5,
    ffn_mult: int = 4,
    fused_attention: bool = True,
    micro_ops: bool = True,
    dropout: bool = True,
    causal: bool = True,
    hbm_bytes_per_s: float = 4.8e12,
    launch_seconds: float = 3e-6,
) -> Profile:
    """Profile of ``layers`` pre-LN GPT blocks, one region (``layers.i``) per block.

    Per block, in dispatch order: layernorm, QKV matmul, attention (flash: saves q, k, v
    as one QKV storage, its output and logsumexp; unfused: QK^T, softmax, dropout, AV),
    output projection (output not saved), dropout, residual add, layernorm, fc1, GELU,
    fc2 (output not saved), dropout, residual add. Block inputs are storages of kind
    ``input``. Matmul and attention seconds are FLOPs / (``device_tflops`` * ``mfu``);
    elementwise seconds are bytes moved / ``hbm_bytes_per_s``; every op takes at least
    ``launch_seconds``. Backward is taken as twice the forward. Every op has ``reads``
    (the ops that created the values it consumes, as the recorder sees them) and the
    dropouts are sinks, so replay is demand-driven as on a recorded block.

    ``dropout``: dropout after attention and MLP with 1-byte masks (Korthikanti's
    accounting; 34*s*b*h bytes per layer in 16-bit with fused attention, 32 without).
    ``micro_ops``: also record layernorm statistics (fp32 mean/rstd per row) and the
    view ops around attention, as an op recorder sees them. ``causal``: flash attention
    skips the masked half of its FLOPs.
    """
    layers = _positive_int(layers, "layers")
    h = _positive_int(hidden, "hidden")
    a = _positive_int(heads, "heads")
    s = _positive_int(seq, "seq")
    b = _positive_int(batch, "batch")
    d = _positive_int(dtype_bytes, "dtype_bytes")
    f = _positive_int(ffn_mult, "ffn_mult")
    if h % a:
        raise ValueError(
            f"hidden = {h} is not divisible by heads = {a}; accepted: heads dividing hidden"
        )
    flops_per_s = _positive(device_tflops, "device_tflops") * 1e12 * _positive(mfu, "mfu")
    if mfu > 1:
        raise ValueError(f"mfu = {mfu!r} is invalid; accepted: a number in (0, 1]")
    hbm = _positive(hbm_bytes_per_s, "hbm_bytes_per_s")
    d2h = float(d2h_gbps)
    h2d = float(h2d_gbps)
    if d2h < 0 or h2d < 0:
        raise ValueError("d2h_gbps and h2d_gbps must be >= 0 (0 = no host link)")

    g = _BlockSpec(
        h=h,
        a=a,
        s=s,
        b=b,
        d=d,
        f=f,
        flops_per_s=flops_per_s,
        hbm=hbm,
        launch_seconds=launch_seconds,
        fused_attention=fused_attention,
        micro_ops=micro_ops,
        dropout=dropout,
        causal=causal,
    )
    regions: list[RegionRecord] = []
    t = 0.0
    for layer in range(layers):
        regions.append(_gpt_block(g, layer, t))
        t += regions[-1].forward_seconds
    return Profile(
        signature=f"gpt:s={s},b={b}",
        device=f"what-if {device_tflops:g} TFLOP/s",
        forward_seconds=t,
        backward_seconds=2.0 * t,
        d2h_gbps=d2h,
        h2d_gbps=h2d,
        regions=regions,
        meta={
            "model": "gpt",
            "layers": layers,
            "hidden": h,
            "heads": a,
            "seq": s,
            "batch": b,
            "dtype_bytes": d,
            "ffn_mult": f,
            "fused_attention": fused_attention,
            "dropout": dropout,
            "micro_ops": micro_ops,
            "device_tflops": device_tflops,
            "mfu": mfu,
        },
    )
