#!/usr/bin/env python3
"""Counts the warp instructions one pass through a loop of a kernel's SASS issues (predicated-off ones included, as
Nsight Compute's inst_executed counts them), following the control flow with the branch outcomes given.

usage: sass_walk.py FILE.sass START END [ADDR=T|N|k ...]
  FILE.sass  `cuobjdump -sass -fun NAME object.cubin` (one function)
  START      the loop head's address (hex, no 0x); END: the address of the loop's back-edge branch (counted, then stop)
  ADDR=T|N   the conditional branch at ADDR taken / not taken; ADDR=k: taken k times, then not (an inner loop of
             k + 1 iterations). A conditional branch met without a decision is an error: every outcome is explicit.
Prints the count and the count per opcode.

docs/benchmarks.md ("The state pass on 8 warps") counts delta_chunk_state_kernel<128, 3> of
kernels/cuda/deltanet_chunked.cu this way (nvcc 13.1, `nvcc -cubin -O3 -std=c++17 -I. -DNDEBUG
-DDFLASH_CUDA_BACKEND=1 -DDFLASH_WITH_CUDA=1 -gencode arch=compute_90,code=sm_90`) for a full chunk with aligned
inputs: the prefetch issued, the fixed-piece path taken, V' and every key tile of the update computed. The addresses
change with the compiler and the source: read the loop's branches (grep BRA) and decide each from the source.
"""
import re, sys, collections
if len(sys.argv) < 4:
    sys.exit(__doc__)
lines = open(sys.argv[1]).read().splitlines()
ins = {}
order = []
for l in lines:
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', l)
    if not m: continue
    a = int(m.group(1), 16); text = m.group(2)
    ins[a] = text; order.append(a)
nxt = {a: b for a, b in zip(order, order[1:])}
start, end = int(sys.argv[2], 16), int(sys.argv[3], 16)
dec = {}
for d in sys.argv[4:]:
    k, v = d.split('='); dec[int(k, 16)] = v
left = {a: int(v) for a, v in dec.items() if v.isdigit()}
pc, n, kinds = start, 0, collections.Counter()
while True:
    t = ins[pc]; n += 1
    op = re.sub(r'^@!?U?P\w+\s+', '', t).split()[0]
    kinds[op.split('.')[0]] += 1
    if pc == end: break
    m = re.match(r'(@!?U?P\w+\s+)?BRA\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)', t)
    if m and 'BRX' not in t:
        tgt = int(m.group(2), 16)
        if m.group(1) is None or m.group(1).strip() in ('@PT',): pc = tgt; continue
        if pc not in dec: sys.exit(f'no decision for the branch at {pc:#x}: {t}')
        v = dec[pc]
        if v == 'T': pc = tgt; continue
        if v == 'N': pc = nxt[pc]; continue
        if left[pc] > 0: left[pc] -= 1; pc = tgt; continue
        pc = nxt[pc]; continue
    if op == 'EXIT' and not t.startswith('@'): break
    pc = nxt[pc]
print(n, 'instructions;', ', '.join(f'{k} {v}' for k, v in kinds.most_common()))
