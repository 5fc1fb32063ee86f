"""What every dflash_prep test case uses: the parsed arguments (A), checks, running dflash_prep, the test
tokenizer, jsonl and HDF5 helpers, the test server (server.py). test_data_prep.py fills A before a case runs."""
import argparse
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")   # no "PyTorch was not found" advisory

HERE = os.path.dirname(os.path.abspath(__file__))
A = argparse.Namespace()   # case, src, build, work: filled by test_data_prep.main before the case runs


def fail(msg):
    print(f"FAIL ({A.case}): {msg}")
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def prep(*args, rc=0, pattern=None, limit_file_kb=None):
    """Runs dflash_prep; checks the exit code, that it ended cleanly (no traceback, no internal error, no signal)
    and (optionally) a text in its output. limit_file_kb: under 'ulimit -f' (with SIGXFSZ ignored, a write past
    the limit fails with EFBIG, as on a full disk). Returns the output."""
    env = dict(os.environ, PYTHONPATH=os.path.join(A.src, "data", "prep"))
    cmd = [sys.executable, "-m", "dflash_prep", *map(str, args)]
    if limit_file_kb:
        cmd = ["bash", "-c", f"trap '' XFSZ; ulimit -f {limit_file_kb}; exec \"$@\"", "bash", *cmd]
    start = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    out = p.stdout + p.stderr
    print(f"$ dflash_prep {' '.join(map(str, args))}\n{out}[exit {p.returncode} after {time.time() - start:.1f} s]")
    expect(p.returncode >= 0, f"killed by signal {-p.returncode}")
    expect("Traceback" not in out and "internal error" not in out, "a Python traceback / internal error")
    expect(p.returncode == rc, f"exit {p.returncode}, expected {rc}")
    if pattern:
        expect(pattern in out, f"output lacks {pattern!r}")
    return out


def make_tokenizer(name="tok", vocab=400, template="plain"):
    d = os.path.join(A.work, name)
    subprocess.run([sys.executable, os.path.join(HERE, "make_tokenizer.py"), d, "--vocab", str(vocab),
                    "--template", template], check=True)
    from transformers import AutoTokenizer
    return d, AutoTokenizer.from_pretrained(d)


def write_jsonl(name, rows):
    path = os.path.join(A.work, name)
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def read_h5(path):
    with h5py.File(path, "r") as f:
        expect(f["tokens"].dtype == np.int32 and f["offsets"].dtype == np.int64 and f["loss_mask"].dtype == np.uint8,
               f"dtypes {f['tokens'].dtype}, {f['offsets'].dtype}, {f['loss_mask'].dtype}")
        t, o, m = f["tokens"][:], f["offsets"][:], f["loss_mask"][:]
    expect(o[0] == 0 and o[-1] == len(t) == len(m) and np.all(np.diff(o) >= 0), "bad offsets")
    return [(t[o[i]:o[i + 1]], m[o[i]:o[i + 1]]) for i in range(len(o) - 1)]


def masked_segments(tok, tokens, mask):
    """Decoded text of each run of loss_mask = 1."""
    segs, j = [], 0
    while j < len(mask):
        if mask[j]:
            k = j
            while k < len(mask) and mask[k]:
                k += 1
            segs.append(tok.decode(tokens[j:k]))
            j = k
        else:
            j += 1
    return segs


def msgs(*pairs):
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


def start_server(tok_dir, name, **opts):
    port_file = os.path.join(A.work, name + ".port")
    if os.path.exists(port_file):
        os.remove(port_file)
    cmd = [sys.executable, os.path.join(HERE, "server.py"), tok_dir, "--port-file", port_file]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd)
    for _ in range(600):
        if os.path.exists(port_file):
            return proc, f"http://127.0.0.1:{open(port_file).read()}"
        expect(proc.poll() is None, "the test server exited")
        time.sleep(0.1)
    fail("the test server did not start within 60 s")


def regen_rows(n):
    """n conversations: prompt-only, one old answer with a system turn, two turns (the second prompt carries the
    first regenerated answer)."""
    topics = ["the sea", "a cat", "the wind", "the stars", "a dog", "the river", "a house", "the fox"]
    rows = []
    for i in range(n):
        t = topics[i % 8]
        if i % 3 == 0:
            rows.append(msgs(("user", f"Tell me a story about {t}, number {i}.")))
        elif i % 3 == 1:
            rows.append(msgs(("system", "Be short."), ("user", f"Write a poem about {t}, {i}."),
                             ("assistant", "an old answer")))
        else:
            rows.append(msgs(("user", f"What is {t}? {i}"), ("assistant", "old"), ("user", "Tell me more."),
                             ("assistant", "old too")))
    return rows
