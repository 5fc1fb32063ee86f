"""Cases hostile_rows, hostile_files and full_disk: input that is wrong in every way a file can be, and outputs
that cannot be written, end with a message naming the file (and line, key or option) and exit 1 (2 for usage
errors): never a traceback, an internal error or a crash (prep() checks that for every run)."""
import copy
import json
import os
import random

import h5py
import numpy as np

from harness import A, expect, make_tokenizer, msgs, prep, read_h5, start_server, write_jsonl

DEEP = 200000   # far deeper than Python's JSON parser goes (RecursionError)
# values of every JSON type, to put where another type belongs
WRONG = [None, True, 7, 2.5, "text", [], [1, "a"], {}, {"a": 1}]


def mutations(row: dict):
    """Copies of row with one field (at any depth) replaced by a value of another type, or removed."""
    out = []

    def walk(node, path):
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for k, v in items:
            for w in WRONG + ["<remove>"]:
                if type(w) is type(v) and w == v:
                    continue
                r = copy.deepcopy(row)
                target = r
                for p in path:
                    target = target[p]
                if w == "<remove>":
                    del target[k]
                else:
                    target[k] = w
                out.append(r)
            if isinstance(v, (dict, list)):
                walk(v, path + [k])
    walk(row, [])
    return out


def hostile_rows():
    """(line text or object, expected reason and message part or None: any clean outcome)."""
    good = msgs(("user", "Hello"), ("assistant", "I am fine."))
    rows = [
        (good, None),
        ("[" * DEEP + "]" * DEEP, "bad_json: not usable JSON: nested too deeply"),
        ('{"messages": ' + "[" * DEEP + "]" * DEEP + "}", "bad_json: not usable JSON: nested too deeply"),
        ('{"text": ' + "1" * 5000 + "}", "bad_json: not usable JSON"),
        ('"just a string"', "bad_json: a row must be a JSON object, got a string"),
        ({"conversations": [{"from": ["human"], "value": "Hi"}, {"from": "gpt", "value": "Hello."}]},
         "bad_turn: conversations[0].from must be a string, got a list"),
        ({"conversations": [{"from": {"a": 1}, "value": "Hi"}]}, "bad_turn: conversations[0].from must be a string"),
        ({"conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": "x"}]},
         "bad_content: conversations[0]: content must be a string or a list of text parts, got a number"),
        ({"system": ["be short"], "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "x"}]},
         "bad_content: 'system' must be a string, got a list"),
        ({"messages": [{"role": ["user"], "content": "Hi"}]}, "bad_turn: messages[0].role must be a string"),
        ({"messages": "Hello"}, "empty: 'messages' must be a non-empty list"),
        ({"messages": [{"role": "user", "content": {"text": "Hi"}}]}, "bad_content: messages[0]: content must be"),
        ({"messages": [{"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "x", "reasoning_content": 3}]},
         "bad_content: messages[1]: reasoning_content must be a string, got a number"),
        ({"messages": good["messages"], "tools": "get_weather"}, "bad_tools: 'tools' must be a list"),
        ({"text": 12}, "bad_content: 'text' must be a non-empty string"),
    ]
    # every field of a few valid rows replaced by every other type: each must be used or rejected cleanly
    base = [good, {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}],
                   "system": "Be short."},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                          {"role": "assistant", "content": None, "reasoning_content": "r",
                           "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                          {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "Done."}],
             "tools": [{"type": "function", "function": {"name": "f"}}]}]
    for b in base:
        rows += [(m, None) for m in mutations(b)]
    return rows


def case_hostile_rows():
    """Input rows wrong in every way (too deep, too long a number, every field of the wrong type): each is written
    or rejected with its line and what is wrong, through one and two worker processes, and as prompt sets."""
    tok_dir, _ = make_tokenizer()
    rows = hostile_rows()
    src = write_jsonl("hostile.jsonl", [r for r, _ in rows])
    out = os.path.join(A.work, "hostile.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out, "--on-reject", "skip", "--workers", 2,
             pattern=f"{len(rows)} rows -> ")
    rej = {r["line"]: r for r in map(json.loads, open(os.path.join(A.work, "hostile.rejects.jsonl")))}
    for line, (_, want) in enumerate(rows, start=1):
        if want:
            got = f"{rej[line]['reason']}: {rej[line]['message']}" if line in rej else "not rejected"
            expect(got.startswith(want), f"line {line}: {got!r}, expected {want!r}")
    print(f"{len(rows)} rows: {len(read_h5(out))} written, {len(rej)} rejected, each with its line")
    # the same hostile lines as prompt sets
    prep("prompts", src, "--tokenizer", tok_dir, "--out", os.path.join(A.work, "p.h5"), rc=1, pattern="bad rows")
    print("PASS (hostile_rows)")


def case_hostile_files():
    """Outputs that cannot be files, impossible numbers, a target, data files and a journal that are garbage."""
    tok_dir, _ = make_tokenizer()
    # outputs that cannot be files: a directory, a path below a file, an input file
    good = write_jsonl("good.jsonl", [msgs(("user", "Hello"), ("assistant", "I am fine."))])
    os.makedirs(os.path.join(A.work, "outdir"), exist_ok=True)
    d = os.path.join(A.work, "outdir")
    prep("tokenize", good, "--tokenizer", tok_dir, "--out", d, rc=1, pattern=f"--out {d} is a directory")
    prep("prompts", good, "--tokenizer", tok_dir, "--out", d, rc=1, pattern=f"--out {d} is a directory")
    prep("regenerate", good, "--server", "http://127.0.0.1:9", "--model", "m", "--out", d, rc=1,
         pattern=f"--out {d} is a directory")
    prep("tokenize", good, "--tokenizer", tok_dir, "--out", os.path.join(good, "x.h5"), rc=1,
         pattern="good.jsonl is a file, not a folder")
    prep("tokenize", good, "--tokenizer", tok_dir, "--out", good, rc=1, pattern="is also an input file")
    prep("tokenize", good, "--tokenizer", tok_dir, "--out", os.path.join(A.work, "g.h5"), "--stats", d, rc=1,
         pattern=f"--stats {d} is a directory")

    # impossible numbers are usage errors naming the option (exit 2), before any work
    for cmd, opt, value in (("tokenize", "--max-len", "-5"), ("tokenize", "--max-len", "0"),
                            ("tokenize", "--workers", "0"), ("tokenize", "--mask-token-id", "-1"),
                            ("prompts", "--max-len", "-1"), ("regenerate", "--top-p", "2"),
                            ("regenerate", "--temperature", "-1"), ("regenerate", "--concurrency", "0"),
                            ("regenerate", "--retries", "0"), ("regenerate", "--max-tokens", "0"),
                            ("regenerate", "--request-timeout", "nan"), ("regenerate", "--retry-wait", "-1"),
                            ("regenerate", "--max-len", "-5")):
        extra = ["--server", "http://127.0.0.1:9"] if cmd == "regenerate" else ["--tokenizer", tok_dir]
        prep(cmd, good, *extra, "--out", os.path.join(A.work, "n.out"), opt, value, rc=2,
             pattern=f"argument {opt}: ")
    prep("check", "--tokenizer", tok_dir, "--target", tok_dir, "--mask-token-id", "-3", rc=2,
         pattern="argument --mask-token-id: -3 must not be negative")

    # a target whose files are garbage
    target = os.path.join(A.work, "target")
    os.makedirs(target, exist_ok=True)
    cfg, gen = os.path.join(target, "config.json"), os.path.join(target, "generation_config.json")
    for name, text, want in (
            ("config.json", "[1, 2]", f"{cfg} (the target's config): must hold a JSON object"),
            ("config.json", "{not json", f"{cfg} (the target's config): not valid JSON"),
            ("config.json", "[" * DEEP, f"{cfg} (the target's config): not usable JSON: nested too deeply"),
            ("config.json", '{"vocab_size": true}', f"{cfg}: no positive integer 'vocab_size'"),
            ("config.json", '{"vocab_size": 512, "eos_token_id": "im_end"}', f"{cfg}: 'eos_token_id' must be"),
            ("config.json", '{"vocab_size": 512, "text_config": [1]}', f"{cfg}: 'text_config' must be an object"),
            ("generation_config.json", "\x00\x01garbage", f"{gen} (the target's generation config): not valid"),
            ("generation_config.json", '{"eos_token_id": [2, "x"]}', f"{gen}: 'eos_token_id' must be")):
        if name == "generation_config.json":
            json.dump({"vocab_size": 512}, open(cfg, "w"))
        with open(os.path.join(target, name), "w") as f:
            f.write(text)
        prep("check", "--tokenizer", tok_dir, "--target", target, rc=1, pattern=want)
    os.remove(gen)
    prep("tokenize", good, "--tokenizer", tok_dir, "--out", os.path.join(A.work, "t.h5"), "--target", target)
    # data files that are not the format
    garbage = os.path.join(A.work, "garbage.h5")
    open(garbage, "w").write("not hdf5")
    two_d = os.path.join(A.work, "2d.h5")
    with h5py.File(two_d, "w") as f:
        f["tokens"] = np.zeros((2, 2), np.int32)
        f["offsets"] = np.zeros(2, np.int64)
        f["loss_mask"] = np.zeros(4, np.uint8)
    o = prep("check", "--tokenizer", tok_dir, "--target", target, "--data", garbage, two_d, rc=1)
    expect("garbage.h5: cannot open as HDF5" in o and "2d.h5: no 1-D integer dataset 'tokens'" in o, "bad data files")
    # a resume journal that is not one
    jout = os.path.join(A.work, "j.jsonl")
    header = json.dumps({"journal": {"input": os.path.abspath(good), "request": {
        "model": "m", "temperature": 0.0, "top_p": 1.0, "max_tokens": 2048}}})
    for text, want in (("[1]\n", "j.jsonl.journal:1: not a journal header"),
                       (header + "\n" + "[" * DEEP + "\n{}\n", "j.jsonl.journal:2: not valid JSON in the middle")):
        open(jout + ".journal", "w").write(text)
        prep("regenerate", good, "--server", "http://127.0.0.1:9", "--model", "m", "--out", jout, rc=1, pattern=want)
    print("PASS (hostile_files)")


def case_full_disk():
    """Writes that fail (RLIMIT_FSIZE: EFBIG, as ENOSPC on a full disk) end with the output's name and the reason,
    no partial file, exit 1; before the fix h5py's close after the failed write crashed the process (SIGSEGV)."""
    tok_dir, _ = make_tokenizer()
    random.seed(1)
    words = "the cat dog sea wind stars river house fox quick brown lazy jumps over hello how are you".split()
    text = lambda: " ".join(random.choice(words) for _ in range(60))  # noqa: E731
    rows = [msgs(("user", f"Tell me {i}: {text()}"), ("assistant", text())) for i in range(120)]
    src = write_jsonl("big.jsonl", rows)
    limit_kb = 12   # the HDF5 files of big.jsonl: 27 KB (tokenize), 18 KB (prompts)
    for cmd in ("tokenize", "prompts"):
        out = os.path.join(A.work, f"{cmd}.h5")
        prep(cmd, src, "--tokenizer", tok_dir, "--out", out, rc=1, limit_file_kb=limit_kb,
             pattern=f"error: cannot write {out}: File too large (errno 27)")
        left = [f for f in os.listdir(A.work) if f.startswith(cmd)]
        expect(not left, f"{cmd}: a failed write left {left}")
    # the rejects file (written after the HDF5 file, which fits) fails: neither it nor a partial file is left
    mixed = write_jsonl("mixed.jsonl", rows[:2] + [msgs(("user", text() * 3))] * 200)
    out = os.path.join(A.work, "mixed.h5")
    prep("tokenize", mixed, "--tokenizer", tok_dir, "--out", out, "--on-reject", "skip")
    expect(os.path.getsize(out) < limit_kb * 1024 < os.path.getsize(os.path.join(A.work, "mixed.rejects.jsonl")),
           "the test's sizes do not bracket the limit")
    os.remove(os.path.join(A.work, "mixed.rejects.jsonl"))
    rejects = os.path.join(A.work, "mixed.rejects.jsonl")
    prep("tokenize", mixed, "--tokenizer", tok_dir, "--out", out, "--on-reject", "skip", rc=1,
         limit_file_kb=limit_kb, pattern=f"cannot write {rejects}: File too large (errno 27)")
    expect(not os.path.exists(rejects) and not os.path.exists(rejects + ".partial"), "a rejects file was left")
    # the regenerate journal fills the disk: the rows before stay, the message says how to resume
    proc, url = start_server(tok_dir, "srv")
    try:
        few = write_jsonl("few.jsonl", rows[:60])
        jout = os.path.join(A.work, "regen.jsonl")
        prep("regenerate", few, "--server", url, "--out", jout, "--max-tokens", 8, "--concurrency", 2, rc=1,
             limit_file_kb=limit_kb, pattern=f"cannot write {jout}.journal: File too large (errno 27)")
        kept = open(jout + ".journal", "rb").read().count(b"\n") - 1   # whole lines after the header
        expect(0 < kept < 60, f"{kept} rows kept in the journal")
        prep("regenerate", few, "--server", url, "--out", jout, "--max-tokens", 8, "--concurrency", 2,
             pattern=f"resuming: {kept} rows already in")
        expect(len(open(jout).readlines()) == 60, "the resumed run did not write every row")
    finally:
        proc.terminate()
    print("PASS (full_disk)")
