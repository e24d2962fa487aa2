"""Hugging Face models as users train them (``transformers``, the optional extra): tiny
configurations of a decoder with learned positions (GPT-2), one with rotary positions
and grouped-query attention (Llama), an encoder-decoder (T5), an encoder whose one
layer group runs once per layer (ALBERT) and a state-space model (Mamba-2), each in
training mode
with the library's defaults (``use_cache=True``: every decoder layer appends to a
key/value cache, NOTE [Stateful arguments]). Gradients are compared bitwise with the
plain run under every variant of the model zoo. Also a Switch Transformer, whose routed
layers save other tensors every step."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

import offrecomp
from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant, train, twin

tf = pytest.importorskip("transformers", reason="transformers is an optional extra (pip install -e '.[transformers]')")

STEPS = 4
VOCAB = 100


class CausalLM(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=x, labels=x).loss


class Seq2Seq(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=x, decoder_input_ids=x[:, :6], labels=x[:, 1:7].contiguous()).loss


def _gpt2() -> nn.Module:
    cfg = tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=VOCAB, n_positions=64)
    return CausalLM(tf.GPT2LMHeadModel(cfg))


def _llama() -> nn.Module:
    cfg = tf.LlamaConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
    )
    return CausalLM(tf.LlamaForCausalLM(cfg))


def _t5() -> nn.Module:
    cfg = tf.T5Config(
        d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=8, vocab_size=VOCAB
    )
    return Seq2Seq(tf.T5ForConditionalGeneration(cfg))


def _albert() -> nn.Module:
    """One layer group called once per layer (NOTE [Stacks without repeats])."""
    cfg = tf.AlbertConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, embedding_size=16,
        vocab_size=VOCAB, max_position_embeddings=64,
    )
    return CausalLM(tf.AlbertForMaskedLM(cfg))


def _mamba2() -> nn.Module:
    """A state-space model whose layers add their tokens, in place, to a counter their
    cache layer holds (NOTE [State written by the forward])."""
    cfg = tf.Mamba2Config(
        hidden_size=32, num_hidden_layers=2, vocab_size=VOCAB, state_size=4, num_heads=4, head_dim=16, n_groups=1,
        expand=2, chunk_size=4,
    )
    return CausalLM(tf.Mamba2ForCausalLM(cfg))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "gpt2": _gpt2, "llama": _llama, "t5": _t5, "albert": _albert, "mamba2": _mamba2,
}


def _batch(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1000 + seed))


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_model_bitwise_equal_to_plain(name: str, variant: str) -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    check_variant(MODELS[name]().train(), _batch, variant, steps=STEPS)


def test_hf_gradient_checkpointing_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """gradient_checkpointing_enable() puts torch.utils.checkpoint inside every decoder
    layer, whose saves offrecomp then never sees: the runtime says so on entry."""
    import offrecomp
    import offrecomp.diagnostics

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = _llama().train()
    model.m.gradient_checkpointing_enable()  # type: ignore[operator]
    offrecomp.diagnostics.clear_warnings()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(model, min_bytes=0):
        model(_batch(0)).backward()
    msgs = [r.getMessage() for r in caplog.records if "owns their activations" in r.getMessage()]
    assert len(msgs) == 1 and "m.model.layers.0" in msgs[0], msgs


class PaddedLM(nn.Module):
    """Batches padded to their own longest sequence, with the attention mask a collator
    gives (dynamic padding): a new input shape at most steps."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, mask = batch
        return self.m(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss


_LENGTHS = [12, 7, 10, 12, 5, 9, 11, 8]


def _padded_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + seed)
    t = _LENGTHS[(seed // 10) % len(_LENGTHS)]  # train(): 10 * step
    ids = torch.randint(1, VOCAB, (2, t), generator=g)
    mask = torch.ones(2, t, dtype=torch.long)
    mask[1, t - t // 3:] = 0  # the second sequence is shorter: right padding
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("variant", ["auto", "auto_tight"])
def test_hf_llama_with_dynamic_padding_borrows_plans(variant: str) -> None:
    """NOTE [Borrowed plans]: the shorter batches run the plan of the longest one seen,
    bitwise equal to the plain run."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    rt, _ = check_variant(PaddedLM(_llama().m).train(), _padded_batch, variant, steps=len(_LENGTHS))
    phases = [s.phase for s in rt.report().steps]
    assert phases[0] == "measure" and phases[1] == "borrowed", phases
    assert phases.count("measure") == 1, phases  # the first batch is the longest


class TwoForwardsUnderAutocast(nn.Module):
    """Two forwards in one bf16 autocast context, one loss (as preference training runs a
    chosen and a rejected sequence): the second forward finds every weight cast in
    autocast's cache (NOTE [Autocast cache])."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.m(input_ids=x, labels=x).loss + self.m(input_ids=x.flip(1), labels=x.flip(1)).loss
        return loss.float()


def test_hf_llama_two_forwards_in_one_autocast_context() -> None:
    """Replays under the dispatch mode of the second forward's layers raised a
    divergence: their recordings lack the weight casts the replays make."""
    torch.manual_seed(0)
    base = _llama()
    assert isinstance(base, CausalLM)
    rt, _ = check_variant(TwoForwardsUnderAutocast(base.m), _batch, "auto_serve", steps=STEPS)
    assert all(s.replays > 0 for s in rt.report().steps[2:])  # planned passes replayed


def test_hf_switch_transformer_routing_is_recomputed_under_auto() -> None:
    """A Switch Transformer routes each token to one expert (with a capacity): its sparse
    layers save other tensors every step, so auto finds them variable (NOTE [Regions
    that vary]); at half of keep's peak they are still dropped and replayed, plans fit
    the budget and planned steps hold it within its margin, and gradients match plain
    bitwise."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = tf.SwitchTransformersConfig(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        num_experts=4, expert_capacity=8, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        decoder_start_token_id=0, pad_token_id=0,
    )
    model = CausalLM(tf.SwitchTransformersForConditionalGeneration(cfg)).train()

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1000 + s))

    probe = twin(model)
    with offrecomp.runtime(probe, mode="keep", min_bytes=0) as rt:
        probe(batch(0)).backward()
    budget = rt.report().steps[0].peak_activation_bytes // 2
    ref = train(twin(model), batch, steps=14)
    rt = offrecomp.runtime(model, budget=budget, min_bytes=0)
    assert_bitwise(ref, train(model, batch, rt, steps=14))
    assert any(r.variable for r in rt.planner.host.regions)
    last = rt.report().steps[-3:]
    assert all(s.phase == "planned" and s.recomputed_bytes > 0 for s in last), [s.phase for s in rt.report().steps]
    # the plans fit the budget; a step routing more than the profile's largest routing may
    # hold more until an audit grows the profile (NOTE [Sizes of regions that vary]): the
    # plan the timings pick can sit within 1% of the budget (on a loaded host), so the
    # steps are held to the budget margin the runtime leaves when it picks a budget itself
    assert all(s.predicted_peak_bytes is not None and s.predicted_peak_bytes <= budget for s in last)
    held = [(s.peak_activation_bytes, budget) for s in last]
    assert all(s.peak_activation_bytes <= budget * (1 + rt.config.budget_margin) for s in last), held


def test_hf_reformer_reversible_layers_are_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """A Reformer runs its layers inside a reversible autograd.Function (no grad in the
    forward, the layers' parts again in the backward): nothing is saved there for
    offrecomp to place, which it says once, and gradients match plain bitwise (NOTE
    [Regions with gradients off])."""
    import offrecomp.diagnostics

    offrecomp.diagnostics.clear_warnings()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = tf.ReformerConfig(
        hidden_size=32, attention_head_size=8, num_attention_heads=4, feed_forward_size=64, vocab_size=VOCAB,
        axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16], attn_layers=["local", "local"], is_decoder=True,
        max_position_embeddings=16, local_attn_chunk_length=4, num_hashes=1,
        # its dropout reseeds from torch.seed() at every step: plain runs differ from each other
        hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
    )
    model = CausalLM(tf.ReformerModelWithLMHead(cfg)).train()

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1000 + s))

    ref = train(twin(model), batch, steps=3)
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, train(model, batch, rt, steps=3))
    said = [r.getMessage() for r in caplog.records if r.name.startswith("offrecomp")]
    assert len(said) == 1 and "gradients off" in said[0] and "layers.0" in said[0], said
    assert "no region call with gradients on" in rt.explain()


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_key_value_cache_in_training_is_named_once(use_cache: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A loop without a trainer callback (NOTE [Cache paused in training]): a decoder
    handed its cache in training costs host time at every layer call, which the runtime
    says once, with the fix; without the cache it says nothing."""
    import offrecomp.diagnostics

    offrecomp.diagnostics.clear_warnings()
    model = _llama().train()
    model.m.config.use_cache = use_cache
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(model, mode="recompute", min_bytes=0):
        for _ in range(3):
            model(x).backward()
    said = [r.getMessage() for r in caplog.records if "key/value cache" in r.getMessage()]
    assert len(said) == (1 if use_cache else 0), said
    if use_cache:
        assert "use_cache=False" in said[0]


class _PrefixLlama(nn.Module):
    """Prefix tuning as peft does it: a trainable key/value prefix per layer, handed to a
    frozen model as a filled cache, which the loss reads."""

    def __init__(self, n_prefix: int = 3) -> None:
        super().__init__()
        self.lm = _llama().m.requires_grad_(False)
        self.lm.config.use_cache = False
        self.prefix = nn.Parameter(torch.randn(3, 2, 1, 2, n_prefix, 8) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.prefix.expand(-1, -1, x.shape[0], -1, -1, -1)
        cache = tf.DynamicCache([(kv[i, 0], kv[i, 1]) for i in range(kv.shape[0])])
        mask = torch.ones(x.shape[0], self.prefix.shape[4] + x.shape[1], dtype=torch.long)
        return self.lm(input_ids=x, attention_mask=mask, past_key_values=cache, labels=x).loss


def test_a_filled_cache_handed_in_by_the_caller_is_not_named(caplog: pytest.LogCaptureFixture) -> None:
    """A cache handed in full (a trainable prefix) is read by the loss, and use_cache does
    not leave it out: no training-cache warning; the prefix trains bitwise."""
    import offrecomp.diagnostics

    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    model = _PrefixLlama()
    batch = lambda s: torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(s))  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt, _ = check_variant(model, batch, "recompute")
    assert not [r for r in caplog.records if "key/value cache" in r.getMessage()]
    assert rt.report().steps[-1].replays > 0
