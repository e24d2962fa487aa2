import re, sys, ast
from collections import defaultdict
rows = defaultdict(dict)
for line in open(sys.argv[1]):
    if not line.startswith("BOOKS"):
        continue
    _, name, v, rest = line.split(None, 3)
    rest = re.sub(r"<Phase\.\w+: '([\w-]+)'>", r"'\1'", rest)
    rows[name][v] = ast.literal_eval(rest)
for name, d in rows.items():
    k = d.get("keep"); r = d.get("recompute"); o = d.get("offload")
    notes = []
    for v in ("keep", "recompute", "offload"):
        b = d.get(v)
        if b and len({t[1:] for t in b}) > 1:
            notes.append(f"{v} books vary: {[t[1:6] for t in b]}")
    if k and r:
        kp = max(t[1] for t in k); rp = max(t[1] for t in r)
        if rp >= kp and kp > 0:
            notes.append(f"recompute peak {rp} >= keep peak {kp}")
        notes.append(f"keep {kp} rec {rp} (rec kept/recomp {r[-1][2]}/{r[-1][4]} in {r[-1][5]})")
    if o and k:
        op = max(t[1] for t in o); kp = max(t[1] for t in k)
        notes.append(f"off peak {op} off {o[-1][3]}")
    for v in ("auto_tight", "auto_serve"):
        b = d.get(v)
        if b and k:
            notes.append(f"{v} last {b[-1][0]} peak {b[-1][1]}")
    print(f"{name:26s} " + " | ".join(notes))
