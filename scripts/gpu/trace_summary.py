#!/usr/bin/env python3
"""trace_summary.py TRACE.csv [--steps N] [--layer FIRST COUNT] — where the time of
graph replays goes, from scripts/gpu/cupti_trace.c's records.

Kernels of one replay share the correlation id of its cudaGraphLaunch. The
replays with the most kernels (the decode step's graph) are taken, the
first --skip of them dropped. For each kernel position in the replay:
duration, gap before it (start − the latest end so far; negative: it
overlapped), and exclusive time (how far it moved the replay's end).
Printed: the replays' spans, a table by kernel (name + grid) with calls a
replay, mean duration, mean gap and exclusive µs a replay, and the
kernel-by-kernel timeline of one stretch (--layer) of the median replay."""
import csv, re, statistics, sys
from collections import defaultdict

def short(name):
    if not name.startswith('_Z'):
        return name
    s, i, parts = name, 2, []
    nested = s[i:i + 1] == 'N'
    if nested:
        i += 1
    while i < len(s):
        m = re.match(r'(\d+)', s[i:])
        if not m:
            break
        n = int(m.group(1)); i += len(m.group(1))
        parts.append(s[i:i + n]); i += n
        if not nested:
            break
        if s[i:i + 1] in ('E', 'I', ''):
            break
    base = '::'.join(p for p in parts if p not in ('_GLOBAL__N_1',))
    tmpl = ''
    if 'ILi' in name:  # first integer template arguments, e.g. BN
        tmpl = '<' + ','.join(re.findall(r'Li(\d+)E', name)[:3]) + '>'
    return base + tmpl

def main():
    args = sys.argv[1:]
    path = args[0]
    skip, layer_first, layer_count = 3, None, 24
    if '--skip' in args: skip = int(args[args.index('--skip') + 1])
    if '--layer' in args:
        i = args.index('--layer'); layer_first = int(args[i + 1]); layer_count = int(args[i + 2])
    by_corr = defaultdict(list)
    with open(path) as f:
        for row in csv.reader(f):
            if len(row) < 10: continue
            kind, st, en, corr, gid = row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4])
            if gid == 0: continue
            name = ','.join(row[9:])
            key = short(name) + (' ' + row[5] if kind == 'K' else '')
            by_corr[corr].append((st, en, key))
    if not by_corr:
        print('no graph replays in', path); return
    most = max(len(v) for v in by_corr.values())
    reps = [sorted(v) for c, v in sorted(by_corr.items()) if len(v) == most]
    reps = reps[skip:] if len(reps) > skip + 2 else reps
    spans = [r[-1][1] - r[0][0] for r in reps]
    spans_end = [max(e for _, e, _ in r) - r[0][0] for r in reps]
    print(f'{len(reps)} replays of {most} records; span median {statistics.median(spans_end)/1e3:.1f} us '
          f'(min {min(spans_end)/1e3:.1f}, max {max(spans_end)/1e3:.1f})')
    stats = defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # calls, dur, gap, excl (summed over replays)
    pos = []
    for r in reps:
        latest = r[0][0]
        rows = []
        for st, en, key in r:
            gap = st - latest
            excl = max(0, en - max(latest, st)) if en > latest else 0
            s = stats[key]; s[0] += 1; s[1] += en - st; s[2] += gap; s[3] += excl
            rows.append((st - r[0][0], en - st, gap, excl, key))
            latest = max(latest, en)
        pos.append(rows)
    n = len(reps)
    tot_excl = sum(s[3] for s in stats.values()) / n
    print(f'{"kernel (grid)":64s} {"/step":>6s} {"dur us":>8s} {"gap us":>7s} {"excl us/step":>12s} {"%":>5s}')
    for key, s in sorted(stats.items(), key=lambda kv: -kv[1][3]):
        calls = s[0] / n
        print(f'{key[:64]:64s} {calls:6.0f} {s[1]/s[0]/1e3:8.2f} {s[2]/s[0]/1e3:7.2f} '
              f'{s[3]/n/1e3:12.1f} {100*s[3]/n/tot_excl:5.1f}')
    gaps = sum(max(0, g) for rows in pos for _, _, g, _, _ in rows) / n
    print(f'idle gaps (sum of positive gaps) {gaps/1e3:.1f} us a step; exclusive total {tot_excl/1e3:.1f} us')
    med = sorted(range(n), key=lambda i: spans_end[i])[n // 2]
    first = layer_first if layer_first is not None else max(0, most // 2 - 6)
    print(f'replay {med}: records {first}..{first + layer_count - 1}')
    print(f'{"t0 us":>9s} {"dur":>7s} {"gap":>7s} {"excl":>7s}  kernel')
    for t0, d, g, e, key in pos[med][first:first + layer_count]:
        print(f'{t0/1e3:9.2f} {d/1e3:7.2f} {g/1e3:7.2f} {e/1e3:7.2f}  {key[:90]}')

main()
