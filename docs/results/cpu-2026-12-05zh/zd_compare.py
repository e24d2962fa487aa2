"""Compare the zd sweep's per-case figures (out/*.json) of a rerun with the committed out/ (out_after/
for the six cases it holds): books and allocator peaks (over 1%), per budget the worst planned step's
books/B, allocator vs keep-based and vs the documented bound (over 0.02 or across 1.05), flags.
    python3 docs/results/cpu-2026-12-05zh/zd_compare.py NEWDIR [BASEDIR ...]   (later base dirs win)"""
import glob, json, sys, os
new = sys.argv[1]; ZD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu-2026-12-05zd")
bases = sys.argv[2:] or [os.path.join(ZD, "out"), os.path.join(ZD, "out_after")]
def load(d):
    return {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(f"{d}/*.json")}
base = {}
for d in bases: base.update({k: (v, os.path.basename(d)) for k, v in load(d).items()})
N = load(new)
def figs(r):
    out = {k: r[k] for k in ("keep_books", "rec_books", "keep_alloc", "rec_alloc", "plain_alloc", "ckpt_alloc")}
    out["ckpt_error"] = bool(r.get("ckpt_error"))
    out["bitwise"] = r["keep_bitwise"] and r["rec_bitwise"] and all(s["bitwise"] for run in r["runs"] for s in run["steps"])
    for run in r["runs"]:
        B = run["B"]; pl = [s for s in run["steps"] if s.get("phase") == "planned"]; f = run["frac"]
        out[f"{f}:planned"] = len(pl)
        out[f"{f}:warns"] = len(run["warnings"])
        if pl:
            out[f"{f}:books/B"] = max(s["books"] for s in pl) / B
            out[f"{f}:keepbased"] = max(s["alloc"] / s["exp_keep"] for s in pl)
            out[f"{f}:docbound"] = max(s["alloc"] / s["allowed_rec"] for s in pl)
        out[f"{f}:flags"] = ",".join(sorted({fl.split(":")[0] for s in pl for fl in s["flags"]}))
    return out
M = lambda n: f"{n/1e6:.2f}M"
nchg = 0
for c in sorted(set(base) | set(N)):
    if c not in N or c not in base:
        print(f"{c}: missing in {'new' if c not in N else 'base'}"); continue
    b, src = base[c]; bf, nf = figs(b), figs(N[c])
    lines = []
    for k in bf:
        x, y = bf[k], nf.get(k)
        if isinstance(x, bool) or isinstance(x, str) or k.endswith(("planned", "warns")):
            if x != y: lines.append(f"{k} {x!r} -> {y!r}")
        elif x is None or y is None:
            if x != y: lines.append(f"{k} {x} -> {y}")
        elif k.endswith(("books", "alloc")):
            if abs(y - x) > 0.01 * max(x, 1): lines.append(f"{k} {M(x)} -> {M(y)} ({y/x:.3f}x)")
        else:
            if abs(y - x) > 0.02 or ((x > 1.05) != (y > 1.05)): lines.append(f"{k} {x:.3f} -> {y:.3f}")
    if lines:
        nchg += 1
        print(f"== {c} (base {src})"); [print("   ", l) for l in lines]
print(f"{nchg} of {len(N)} cases with a changed figure")
