"""Re-plans per 1,500 steps when each window of 8 drifts with probability q (50 seeds):
the rule before (a fitting window resets the backoff), a fit halving the window
("halve"), a leaky count ("leak"), and remembering the latest six windows (run_hist, K=2:
more than two drifting grows the window; the rule adopted).

    python3 docs/results/cpu-2026-12-05zn/sim_drift.py
"""
import random
W,R,M=8,2,8
def run(q, rule, steps=1500, seed=0):
    rnd=random.Random(seed); rep=0; back=0; s=0; replans=0
    while s<steps:
        s += W<<back
        bad = rnd.random()<q
        if not bad:
            if rule=="old": rep=back=0
            elif rule=="halve":
                if back>0: back-=1
                else: rep=0
            elif rule=="leak":
                rep=max(0,rep-1)
                if rep<=R and back>0: back-=1
            continue
        replans+=1; rep+=1
        if rep>R: back=min(M,back+1)
    return replans
for q in (0.1,0.2,0.3,0.5,0.8,1.0):
    print(q, {r: sum(run(q,r,seed=i) for i in range(50))/50 for r in ("old","halve","leak")})
def run_hist(q, steps=1500, seed=0, H=6, K=2):
    rnd=random.Random(seed); back=0; s=0; replans=0; hist=[]
    while s<steps:
        s += W<<back
        bad = rnd.random()<q
        hist.append(bad); hist=hist[-H:]
        n=sum(hist)
        if not bad:
            if n<=1 and back>0: back-=1
            continue
        replans+=1
        if n>K: back=min(M,back+1)
    return replans
for q in (0.05,0.1,0.2,0.3,0.5,0.8,1.0):
    print(q, [sum(run_hist(q,seed=i,K=k) for i in range(50))/50 for k in (1,2)])
