"""Shares of py-spy's raw samples (``-f raw``) under profile_loop.py's loop, by function
(inclusive) and by line (self)."""

import collections
import re
import sys

incl: collections.Counter[str] = collections.Counter()
by_line: collections.Counter[str] = collections.Counter()
total = 0
with open(sys.argv[1]) as f:
    lines = f.readlines()
for line in lines:
    stack, n_text = line.rstrip().rsplit(" ", 1)
    n = int(n_text)
    frames = stack.split(";")
    if not any("profile_loop.py:30" in f for f in frames):  # the loop line
        continue
    total += n
    for name in {re.sub(r" \((.*):(\d+)\)", r" \1", f) for f in frames}:
        incl[name] += n
    by_line[frames[-1]] += n
print(f"samples in the loop: {total}")
print("--- inclusive, by function")
for k, v in incl.most_common(45):
    print(f"{100 * v / total:5.1f}% {k}")
print("--- self, by line")
for k, v in by_line.most_common(30):
    print(f"{100 * v / total:5.1f}% {k}")
