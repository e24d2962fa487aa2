"""A diffusers UNet2DConditionModel (tiny) whose attention processors are swapped every
step (AttnProcessor2_0 / AttnProcessor, the second saving its probabilities), trained
under auto at a budget: each step's phase and booked activation peak.
Run: python diffusers_processor_swap.py STEPS BUDGET (diffusers 0.42.1 on the path)."""
import sys, torch, torch.nn.functional as F
import offrecomp
from diffusers import UNet2DConditionModel
from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0
torch.manual_seed(0)
m = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16), norm_num_groups=4, cross_attention_dim=12,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=4)
opt = torch.optim.AdamW(m.parameters())
N = int(sys.argv[1]) if len(sys.argv) > 1 else 12
with offrecomp.runtime(m, budget=int(sys.argv[2])) as rt:
    for i in range(N):
        m.set_attn_processor(AttnProcessor() if i % 2 else AttnProcessor2_0())
        g = torch.Generator().manual_seed(i)
        x, e, y = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 5, 12, generator=g), torch.randn(2, 4, 16, 16, generator=g)
        loss = F.mse_loss(m(x, torch.tensor([1, 500]), encoder_hidden_states=e).sample, y)
        loss.backward(); opt.step(); opt.zero_grad()
for s in rt.report().steps:
    print(s.step, s.phase.value, s.peak_activation_bytes, s.budget_bytes, s.notes[:1])
