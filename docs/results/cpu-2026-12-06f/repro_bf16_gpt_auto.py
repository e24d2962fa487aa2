"""auto at 30% of keep's booked peak, GPT under bf16 autocast: the planned step's books are
within the budget, the allocator's activation peak is ~1.2x the budget; nothing is logged."""
import logging, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from repro_common import *  # noqa
from tests import models

torch.manual_seed(0)
model = models.GPT(layers=4, h=64, heads=4, p=0.1)
batch = torch.randint(0, 64, (4, 64), generator=torch.Generator().manual_seed(1000))
FRAC = float(sys.argv[1]) if len(sys.argv) > 1 else 0.3

logs = []
h = logging.Handler(logging.WARNING); h.emit = lambda r: logs.append(r.getMessage())
logging.getLogger("offrecomp").addHandler(h)

saved = plain_saved(model, batch, True)
plain, _ = measure(model, batch, True)
overhead = plain - saved                       # what a plain step holds besides its saves
keep_peak, keep_rec, _ = measure(model, batch, True, mode="keep", min_bytes=0)
rec_peak, rec_rec, _ = measure(model, batch, True, mode="recompute", min_bytes=0)
budget = int(FRAC * keep_rec.peak_activation_bytes)
ours, rec, rt = measure(model, batch, True, warm=5, mode="auto", budget=budget, min_bytes=0, drift=100.0)
act = ours - overhead
allowed = rec_peak + (budget - rec_rec.peak_activation_bytes) + 0.05 * budget  # test_budgets' bound
print(f"plain: alloc peak {plain} saved {saved} (overhead {overhead}); keep: books {keep_rec.peak_activation_bytes} alloc {keep_peak}")
print(f"recompute: books {rec_rec.peak_activation_bytes} alloc {rec_peak}")
print(f"auto {rec.phase}: budget {budget} books {rec.peak_activation_bytes} predicted {rec.predicted_peak_bytes} "
      f"allocator peak {ours} -> activation {act} = {act / budget:.3f}x budget; test_budgets bound {allowed:.0f} ({ours / allowed:.3f}x)")
print("warnings:", logs)
bad = rec.phase == "planned" and rec.peak_activation_bytes <= budget and act > 1.1 * budget and not logs
sys.exit(1 if bad else 0)
