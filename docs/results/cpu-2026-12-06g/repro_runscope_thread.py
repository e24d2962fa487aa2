"""NOTE [Runs left open] (integrations/_common.py): a trainer run that ended by an
exception leaves the runtime entered, and the scope's next run leaves it first. When
the first run was on a worker thread (a sweep running trials in a thread pool) that has
since finished, the next run's enter now fails: Runtime.__exit__ raises the new
'entered on thread X, left on thread Y' error, though thread X is gone (and its
saved-tensor hook stack with it), after RunScope.exit already marked itself outside;
the runtime then stays active for good and every later run fails too."""
import sys, os, threading
ROOT = os.environ.get("ROOT", str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, ROOT)
import torch
from torch import nn
from offrecomp.integrations._common import RunScope

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
scope = RunScope({"mode": "recompute"})

def trial():
    scope.enter(model)
    model(torch.randn(2, 8)).sum().backward()
    # the trainer raised here: no callback left the runtime

t = threading.Thread(target=trial, name="trial-0")
t.start(); t.join()
print("first trial's thread alive:", t.is_alive())

failures = []
for attempt in range(2):
    try:
        rt = scope.enter(model)
        model(torch.randn(2, 8)).sum().backward()
        scope.exit(None)
        print("run", attempt, "ok")
    except RuntimeError as e:
        failures.append(str(e))
        print("run", attempt, "failed:", str(e)[:160])
sys.stdout.flush(); os._exit(1 if failures else 0)  # os._exit: the still-active runtime aborts the interpreter at teardown (rc 134)
