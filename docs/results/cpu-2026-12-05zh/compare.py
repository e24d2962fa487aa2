"""Compare the PASS/FAIL lines (NAME VARIANT) of committed sweep outputs with a rerun's: counts per
variant, and every (name, variant) whose outcome changed.
    python3 docs/results/cpu-2026-12-05zh/compare.py BASE1[,BASE2...] NEW1[,NEW2...]"""
import re, sys, collections
def load(files):
    d = {}
    for f in files.split(","):
        for line in open(f, errors="replace"):
            m = re.match(r"^(PASS|FAIL|ERROR|SKIP|NO_DROP)\s+(\S+)\s+(\S+)\s*(.*)", line)
            if m:
                d[(m[2], m[3])] = (m[1], m[4][:200])
    return d
b, n = load(sys.argv[1]), load(sys.argv[2])
def tally(d):
    c = collections.Counter(s for s, _ in d.values())
    return dict(c)
print("base:", len(b), tally(b), " new:", len(n), tally(n))
pv = collections.defaultdict(collections.Counter)
for (name, v), (s, _) in n.items(): pv[v][s] += 1
for v, c in pv.items(): print(f"  {v:12s} {dict(c)}")
for k in sorted(set(b) | set(n)):
    bs = b.get(k, ("-", ""))[0]; ns = n.get(k, ("-", ""))[0]
    if bs != ns:
        print(f"CHANGED {k[0]:24s} {k[1]:12s} {bs} -> {ns}   {n.get(k, ('', ''))[1]}")
