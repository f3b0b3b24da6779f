import csv, sys, collections
path = sys.argv[1]
rows = list(csv.reader(open(path)))
hdr = rows[1]; data = rows[2:]
idx = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot = collections.Counter()
for r in data:
    for h in stall_cols:
        try: tot[h] += float(r[idx[h]] or 0)
        except ValueError: pass
S = sum(tot.values())
print("total samples", S)
for h, v in tot.most_common(12): print(f"  {h:28s} {v/S:6.1%}")
# top instructions
def n(r, h):
    try: return float(r[idx[h]] or 0)
    except ValueError: return 0.0
top = sorted(data, key=lambda r: -n(r, 'Warp Stall Sampling (All Samples)'))[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]
for r in top:
    reasons = sorted(((n(r, h), h[6:]) for h in stall_cols), reverse=True)[:3]
    print(f"{r[0]:>6} {n(r,'Warp Stall Sampling (All Samples)')/S:6.2%}  {r[1][:60]:60s} " + ", ".join(f"{h} {v/S:.2%}" for v, h in reasons if v))
