"""dflash_prep end to end, one case per ctest test (tests/integration/data_prep.sh runs it in the prep venv).
  test_data_prep.py CASE --src SOURCE_DIR --build BUILD_DIR --work WORK_DIR
Cases here: masks, think, rejects, truncation, regenerate, regenerate_serve, check, trains, prompts; in
cases_tools.py: tools; cases_hostile.py: hostile_rows, hostile_files, full_disk; cases_faults.py:
regenerate_hostile, regenerate_servers; cases_package.py: package. Each builds its own tokenizer with
make_tokenizer.py (byte-level BPE trained on a few lines, Qwen3-style ChatML template). Every dflash_prep run of
every case must end without a Python traceback, an 'internal error' or a signal, whatever its input (harness.prep).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

import cases_faults
import cases_hostile
import cases_package
import cases_tools
from harness import A, expect, fail, make_tokenizer, masked_segments, msgs, prep, read_h5, regen_rows, \
    start_server, write_jsonl


def case_masks():
    tok_dir, tok = make_tokenizer()
    rows = [
        msgs(("user", "What is the capital of France?"), ("assistant", "The capital of France is Paris.")),
        # multi-turn with a system turn; the second answer repeats the question's text (must not match there)
        msgs(("system", "Be short."), ("user", "Hello, how are you?"), ("assistant", "I am fine, thank you."),
             ("user", "Say: the dog"), ("assistant", "the dog")),
        # the same conversation as row 1 in ShareGPT form
        {"conversations": [{"from": "human", "value": "What is the capital of France?"},
                           {"from": "gpt", "value": "The capital of France is Paris."}]},
        {"text": "The quick brown fox jumps over the lazy dog."},
        # OpenAI content parts
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me "}, {"type": "text",
                                                                                        "text": "a story."}]},
                      {"role": "assistant", "content": "A cat and a dog live in a small house."}]},
    ]
    src = write_jsonl("in.jsonl", rows)
    out = os.path.join(A.work, "out.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out,
         pattern="5 rows -> 5 sequences")
    seqs = read_h5(out)
    expect(len(seqs) == 5, f"{len(seqs)} sequences")
    expected = [["The capital of France is Paris.<|im_end|>"],
                ["I am fine, thank you.<|im_end|>", "the dog<|im_end|>"],
                ["The capital of France is Paris.<|im_end|>"],
                ["The quick brown fox jumps over the lazy dog."],
                ["A cat and a dog live in a small house.<|im_end|>"]]
    for i, ((t, m), want) in enumerate(zip(seqs, expected)):
        got = masked_segments(tok, t, m)
        print(f"sequence {i}: masked {got}")
        expect(got == want, f"sequence {i}: masked {got}, expected {want}")
    # decode round trip: the tokens are the chat template's rendering, tokenized without extra special tokens
    for i in (0, 1, 4):
        conv = [dict(role=m["role"], content=m["content"] if isinstance(m["content"], str)
                     else "".join(p["text"] for p in m["content"])) for m in rows[i]["messages"]]
        rendered = tok.apply_chat_template(conv, tokenize=False)
        expect(tok.decode(seqs[i][0]) == rendered, f"sequence {i} does not decode to the rendered chat")
        expect(list(seqs[i][0]) == tok(rendered, add_special_tokens=False)["input_ids"],
               f"sequence {i}: tokens differ from the tokenizer's own encoding of the rendered chat")
    expect(np.array_equal(seqs[0][0], seqs[2][0]) and np.array_equal(seqs[0][1], seqs[2][1]),
           "OpenAI and ShareGPT forms of one conversation differ")
    # the end-of-turn token is the last masked token, the newline after it is not trained
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    t, m = seqs[1]
    ends = np.nonzero(t == im_end)[0]
    expect(len(ends) == 5, f"{len(ends)} <|im_end|> in sequence 1")
    expect(list(m[ends]) == [0, 0, 1, 0, 1], f"mask on <|im_end|>: {list(m[ends])} (system, user, asst, user, asst)")
    expect(all(m[e + 1] == 0 for e in ends if e + 1 < len(t)), "a token after <|im_end|> is trained")
    stats = json.load(open(os.path.join(A.work, "out.stats.json")))["total"]
    expect(stats["sequences"] == 5 and stats["trained_tokens"] == int(sum(m.sum() for _, m in seqs)),
           f"statistics disagree with the file: {stats}")
    expect(stats["end_of_turn"] == {"<|im_end|>": 5}, f"end-of-turn tokens {stats['end_of_turn']}")
    # two worker processes write the same file content
    out2 = os.path.join(A.work, "out2.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out2, "--workers", 2, pattern="5 rows -> 5 sequences")
    expect(all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(seqs, read_h5(out2))),
           "--workers 2 wrote other data than one process")
    print("PASS (masks)")


def case_think():
    tok_dir, tok = make_tokenizer()
    rows = [
        msgs(("user", "What is two plus two?"), ("assistant", "<think>\nLet me think step by step.\n</think>\n\n"
                                                               "Two plus two is four.")),
        {"messages": [{"role": "user", "content": "What is two plus two?"},
                      {"role": "assistant", "content": "Two plus two is four.",
                       "reasoning_content": "Let me think step by step."}]},
        # reasoning in the first turn: the template renders no reasoning for turns before the last user turn
        msgs(("user", "Hello"), ("assistant", "<think>\nthink about it\n</think>\n\nHello, how are you?"),
             ("user", "Tell me a story."), ("assistant", "<think>\na cat story\n</think>\n\nA cat.")),
    ]
    src = write_jsonl("think.jsonl", rows)
    keep, drop = os.path.join(A.work, "keep.h5"), os.path.join(A.work, "drop.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", keep, "--think", "keep")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", drop, "--think", "drop")
    k, d = read_h5(keep), read_h5(drop)
    want_keep = [["<think>\nLet me think step by step.\n</think>\n\nTwo plus two is four.<|im_end|>"]] * 2 + \
        [["Hello, how are you?<|im_end|>", "<think>\na cat story\n</think>\n\nA cat.<|im_end|>"]]
    want_drop = [["Two plus two is four.<|im_end|>"]] * 2 + [["Hello, how are you?<|im_end|>", "A cat.<|im_end|>"]]
    for i in range(3):
        gk, gd = masked_segments(tok, *k[i]), masked_segments(tok, *d[i])
        print(f"sequence {i}: keep {gk}\n            drop {gd}")
        expect(gk == want_keep[i], f"keep, sequence {i}: {gk}")
        expect(gd == want_drop[i], f"drop, sequence {i}: {gd}")
    # dropped: the template's empty think block of the last turn is context (loss_mask 0), not trained
    expect("<think>\n\n</think>\n\nTwo plus two" in tok.decode(d[0][0]), "drop: no empty think block rendered")
    st = json.load(open(os.path.join(A.work, "keep.stats.json")))["total"]
    expect(st["reasoning_dropped_by_template"] == 1, f"reasoning_dropped_by_template {st}")
    print("PASS (think)")


def case_rejects():
    tok_dir, _ = make_tokenizer()
    good = msgs(("user", "Hello"), ("assistant", "I am fine."))
    rows = [good, good, msgs(("user", "Hello, how are you?")), good, '{"messages": [ broken', good,
            {"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y z"}]},
            {"prompt": "no known key"}, msgs(("user", "a"), ("assistant", "<think>never closed"))]
    src = write_jsonl("rej.jsonl", rows)
    out = os.path.join(A.work, "rej.h5")
    o = prep("tokenize", src, "--tokenizer", tok_dir, "--out", out, rc=1, pattern="5 rows rejected, nothing written")
    for line, reason in ((3, "no_assistant"), (5, "bad_json"), (7, "unknown_role"), (8, "unknown_format"),
                         (9, "unclosed_think")):
        expect(f"rej.jsonl:{line}: {reason}" in o, f"line {line} not reported as {reason}")
    expect(not os.path.exists(out) and not os.path.exists(out + ".partial"), "a failed run left a file behind")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out, "--on-reject", "skip",
         pattern="5 rejected rows written to")
    expect(len(read_h5(out)) == 4, "skip: expected the 4 good rows")
    rej = [json.loads(x) for x in open(os.path.join(A.work, "rej.rejects.jsonl"))]
    expect([(r["line"], r["reason"]) for r in rej] == [(3, "no_assistant"), (5, "bad_json"), (7, "unknown_role"),
                                                       (8, "unknown_format"), (9, "unclosed_think")],
           f"rejects file: {[(r['line'], r['reason']) for r in rej]}")
    expect(rej[1]["row"].startswith('{"messages": [ broken'), "the rejects file lacks the row's text")
    st = json.load(open(os.path.join(A.work, "rej.stats.json")))["total"]
    expect(st["rows"] == 9 and st["rejected"] == 5 and st["sequences"] == 4, f"statistics {st}")
    prep("tokenize", os.path.join(A.work, "missing.jsonl"), "--tokenizer", tok_dir, "--out", out, rc=1,
         pattern="missing.jsonl not found")
    print("PASS (rejects)")


def case_truncation():
    tok_dir, tok = make_tokenizer()
    long_answer = " ".join(["The quick brown fox jumps over the lazy dog."] * 6)
    rows = [msgs(("user", "Tell me a story."), ("assistant", long_answer)),
            msgs(("user", "Hi"), ("assistant", "Hello.")),
            msgs(("user", " ".join(["Please write a short poem about the sea."] * 8)), ("assistant", "No."))]
    src = write_jsonl("trunc.jsonl", rows)
    full = os.path.join(A.work, "full.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", full)
    lens = [len(t) for t, _ in read_h5(full)]
    prompt2 = len(tok(tok.apply_chat_template(rows[2]["messages"][:1], tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"])
    max_len = 40
    expect(lens[0] > max_len and lens[1] < max_len and prompt2 > max_len, f"lengths {lens}, prompt {prompt2}")
    out = os.path.join(A.work, "head.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out, "--max-len", max_len, "--on-reject", "skip",
         pattern="1 truncated, rejected 1 (prompt_too_long 1)")
    seqs, ref = read_h5(out), read_h5(full)
    expect(len(seqs) == 2 and len(seqs[0][0]) == max_len, f"head: lengths {[len(t) for t, _ in seqs]}")
    expect(np.array_equal(seqs[0][0], ref[0][0][:max_len]) and np.array_equal(seqs[0][1], ref[0][1][:max_len]),
           "head: not the first max-len tokens and mask of the full sequence")
    expect(np.array_equal(seqs[1][0], ref[1][0]), "head: a short row changed")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out, "--max-len", max_len, "--truncate", "reject",
         "--on-reject", "skip", pattern="0 truncated, rejected 2 (too_long 2)")
    expect(len(read_h5(out)) == 1, "reject: expected the one short row")
    print("PASS (truncation)")


def kill_and_resume(tok_dir, tok, rows, src, url_ref, url_run, kill_after, max_tokens, concurrency):
    """One uninterrupted run against url_ref; one run against url_run killed (SIGKILL) once kill_after rows are in
    its journal, then resumed with the same command and tokenized (--h5). The two outputs must be identical, one
    row per input row, every assistant turn regenerated, the masks on the generated answers."""
    n = len(rows)
    ref = os.path.join(A.work, "ref.jsonl")
    prep("regenerate", src, "--server", url_ref, "--out", ref, "--max-tokens", max_tokens, "--concurrency",
         concurrency, pattern=f"wrote {ref}: {n} rows")
    out = os.path.join(A.work, "regen.jsonl")
    h5 = os.path.join(A.work, "regen.h5")
    args = ["regenerate", src, "--server", url_run, "--out", out, "--max-tokens", max_tokens, "--concurrency",
            concurrency, "--h5", h5, "--tokenizer", tok_dir]
    env = dict(os.environ, PYTHONPATH=os.path.join(A.src, "data", "prep"))
    p = subprocess.Popen([sys.executable, "-m", "dflash_prep", *map(str, args)], env=env)
    journal = out + ".journal"
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(journal) and sum(1 for _ in open(journal)) >= kill_after + 1:   # + the header line
            break
        expect(p.poll() is None, "regenerate ended before it could be killed")
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = sum(1 for _ in open(journal)) - 1
    print(f"killed with {done} rows in the journal")
    expect(kill_after <= done < n, f"{done} rows in the journal at the kill")
    o = prep(*args, pattern=f"resuming: {done} rows already in")
    expect(f"{n} rows, {done} done, {n - done} to generate" in o, "the resume does not skip the done rows")
    expect(not os.path.exists(journal), "the journal was not removed at the end")
    got, want = open(out).read(), open(ref).read()
    expect(got == want, "the resumed output differs from the uninterrupted run")
    res = [json.loads(x) for x in got.splitlines()]
    expect([r["key"] for r in res] == list(range(1, n + 1)), f"keys {[r['key'] for r in res]}")
    for r, row in zip(res, rows):
        turns = [m["role"] for m in r["messages"]]
        want_turns = [m["role"] for m in row["messages"]] + (["assistant"] if row["messages"][-1]["role"] == "user"
                                                             else [])
        expect(turns == want_turns, f"key {r['key']}: roles {turns}, expected {want_turns}")
        answers = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        expect(all(a.strip() and a not in ("old", "old too", "an old answer") for a in answers),
               f"key {r['key']}: an answer was not regenerated: {answers}")
    seqs = read_h5(h5)
    expect(len(seqs) == n, f"{len(seqs)} sequences in {h5}")
    for i in range(n):
        answers = [m["content"].strip() + "<|im_end|>" for m in res[i]["messages"] if m["role"] == "assistant"]
        got_segs = [s.strip() for s in masked_segments(tok, *seqs[i])]
        expect(got_segs == answers, f"sequence {i}: masked {got_segs}, expected {answers}")
    return res


def case_regenerate():
    """Against server.py (http.server + a deterministic trigram rule; one server answers every 5th request with
    HTTP 503 and sleeps 0.15 s per request, so the run can be killed in the middle)."""
    tok_dir, tok = make_tokenizer()
    rows = regen_rows(24)
    src = write_jsonl("prompts.jsonl", rows)
    fast, url_fast = start_server(tok_dir, "fast")
    slow, url_slow = start_server(tok_dir, "slow", delay=0.15, fail_every=5)
    try:
        res = kill_and_resume(tok_dir, tok, rows, src, url_fast, url_slow, kill_after=8, max_tokens=24,
                              concurrency=4)
        expect(res[2]["messages"][1]["content"] != res[2]["messages"][3]["content"], "two equal turns")
        # a row the server refuses (HTTP 400) is a reject with its line, not a lost or endless row
        bad = write_jsonl("bad.jsonl", [msgs(("user", "Hello")), msgs(("user", "FAIL_400 please")),
                                        {"text": "plain"}])
        bad_out = os.path.join(A.work, "bad.jsonl.out")
        o = prep("regenerate", bad, "--server", url_fast, "--out", bad_out, rc=1, pattern="2 rows rejected")
        expect("bad.jsonl:2: server_refused: HTTP 400" in o and "bad.jsonl:3: text_row" in o, "rejects not named")
        # the journal keeps the finished row; resuming it with another sampling setting is refused
        prep("regenerate", bad, "--server", url_fast, "--out", bad_out, "--max-tokens", 5, rc=1,
             pattern="was started with other settings (request)")
        prep("regenerate", bad, "--server", url_fast, "--out", bad_out, "--on-reject", "skip",
             pattern="1 rows already in")
        expect(len(open(bad_out).readlines()) == 1, "skip: expected 1 row")
        # a server that is down: the run stops with the reason after its retries, nothing is written
        fast.terminate()
        fast.wait()
        prep("regenerate", src, "--server", url_fast, "--out", os.path.join(A.work, "down.jsonl"), "--retries", 2,
             rc=1, pattern="cannot list the server's models")
    finally:
        fast.terminate()
        slow.terminate()
    print("PASS (regenerate)")


def serve_python():
    """The Python of the environment with torch and transformers[serving] (install_prep.sh --serve), or None."""
    venv = os.environ.get("DFLASH_PREP_SERVE_VENV", os.path.join(A.src, "data", "prep", ".venv-serve"))
    py = os.path.join(venv, "bin", "python")
    ok = os.path.exists(py) and subprocess.run([py, "-c", "import torch, fastapi, uvicorn, transformers"],
                                               capture_output=True).returncode == 0
    return py if ok else None


def case_regenerate_serve():
    """The same kill-and-resume against a real serving engine: transformers' own 'transformers serve' on CPU with
    a tiny random Qwen3 (2 layers, hidden 32) built on the test tokenizer. Its generation_config suppresses the
    special and non-text tokens, so the answers are plain text the template can render back."""
    py = serve_python()
    if py is None:
        print("SKIP (regenerate_serve): no environment with torch and transformers[serving] (data/prep/.venv-serve or "
              "$DFLASH_PREP_SERVE_VENV; about 5.7 GB, PyPI's torch is the CUDA build). mpi_launch/test.sh makes it "
              "unless DFLASH_PREP_SERVE=0; by hand: bash mpi_launch/install_prep.sh --serve")
        sys.exit(77)
    tok_dir, tok = make_tokenizer()
    model = os.path.join(A.work, "tiny_qwen3")
    subprocess.run([py, "-c", TINY_QWEN3, tok_dir, model], check=True)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([os.path.join(os.path.dirname(py), "transformers"), "serve", model, "--device", "cpu",
                               "--port", str(port), "--host", "127.0.0.1"])
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request
        deadline = time.time() + 180
        while True:
            expect(server.poll() is None, "transformers serve exited")
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                expect(time.time() < deadline, "transformers serve did not start within 180 s")
                time.sleep(0.5)
        rows = regen_rows(12)
        src = write_jsonl("prompts.jsonl", rows)
        kill_and_resume(tok_dir, tok, rows, src, url, url, kill_after=4, max_tokens=16, concurrency=2)
    finally:
        server.terminate()
        server.wait(30)
    print("PASS (regenerate_serve)")


TINY_QWEN3 = """
import re, sys, torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM
tok = AutoTokenizer.from_pretrained(sys.argv[1])
cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
model = Qwen3ForCausalLM(cfg)
specials = {t.content for t in tok.added_tokens_decoder.values()}
bad = sorted(i for p, i in tok.get_vocab().items() if i != tok.eos_token_id
             and (p in specials or not re.fullmatch(r"[A-Za-z ,.?!]+", tok.decode([i]))))
model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                           suppress_tokens=bad, do_sample=False)
model.save_pretrained(sys.argv[2])
tok.save_pretrained(sys.argv[2])
"""


def case_check():
    tok_dir, tok = make_tokenizer()
    target = os.path.join(A.work, "target")
    os.makedirs(target, exist_ok=True)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    json.dump({"vocab_size": 512, "eos_token_id": im_end}, open(os.path.join(target, "config.json"), "w"))
    src = write_jsonl("c.jsonl", [msgs(("user", "Hello"), ("assistant", "I am fine, thank you."))])
    data = os.path.join(A.work, "c.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", data, "--target", target, "--mask-token-id", 511)
    prep("check", "--tokenizer", tok_dir, "--target", target, "--mask-token-id", 511, "--data", data,
         pattern="check: OK")
    # the data contains the mask token when it is a token the text uses
    t, _ = read_h5(data)[0]
    used = int(t[5])
    prep("check", "--tokenizer", tok_dir, "--target", target, "--mask-token-id", used, "--data", data, rc=1,
         pattern=f"the mask token {used} occurs")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", data, "--target", target, "--mask-token-id", used, rc=1,
         pattern="mask_token_in_data")
    # a tokenizer with more tokens than the target's vocab
    json.dump({"vocab_size": 300, "eos_token_id": im_end}, open(os.path.join(target, "config.json"), "w"))
    prep("check", "--tokenizer", tok_dir, "--target", target, rc=1, pattern="has 400 tokens but the target")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", data, "--target", target, rc=1,
         pattern="has 400 tokens but the target")
    # eos of the target is not the tokenizer's end of turn
    json.dump({"vocab_size": 512, "eos_token_id": 7}, open(os.path.join(target, "config.json"), "w"))
    prep("check", "--tokenizer", tok_dir, "--target", target, rc=1, pattern="eos_token_id 7 is not a special token")
    # the target's own tokenizer differs from the one given
    json.dump({"vocab_size": 1024}, open(os.path.join(target, "config.json"), "w"))
    other_dir, _ = make_tokenizer("other", vocab=380)
    shutil.copy(os.path.join(other_dir, "tokenizer.json"), os.path.join(target, "tokenizer.json"))
    prep("check", "--tokenizer", tok_dir, "--target", target, rc=1, pattern="differs from the target's own")
    print("PASS (check)")


def case_trains():
    """Prepared chat data trains: the tiny target (vocab 512, mask token 511) on data tokenized with a 400-token
    tokenizer; dflash_data inspect validates it, dflash_mpi runs 4 steps on it."""
    tok_dir, _ = make_tokenizer(vocab=400)
    tiny = os.path.join(A.build, "tests", "integration", "tiny_data", "target")
    expect(os.path.exists(os.path.join(tiny, "config.json")), f"no tiny target at {tiny} (fixture tiny_data)")
    words = ["Hello", "the cat", "a dog", "the sea", "Paris", "the fox", "a house", "the stars"]
    rows = [msgs(("user", f"Tell me about {words[i % 8]} and {words[(i * 3) % 8]}."),
                 ("assistant", f"{words[(i + 1) % 8]} is near {words[(i * 5) % 8]}. The quick brown fox jumps over "
                               f"the lazy dog, {i} times.")) for i in range(24)]
    src = write_jsonl("train.jsonl", rows)
    data = os.path.join(A.work, "train.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", data, "--target", tiny, "--mask-token-id", 511)
    prep("check", "--tokenizer", tok_dir, "--target", tiny, "--mask-token-id", 511, "--data", data,
         pattern="check: OK")
    run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True)  # noqa: E731
    p = run([os.path.join(A.build, "apps", "dflash_data"), "inspect", data, "--vocab", "511"])
    print(p.stdout + p.stderr)
    expect(p.returncode == 0 and re.search(r"sequences\s+24\n", p.stdout) and re.search(r"valid\s+yes", p.stdout),
           "dflash_data inspect refused the prepared data")
    out = os.path.join(A.work, "run")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(A.src, "tests", "integration", "mpirun.sh"), "-np", "8",
           os.path.join(A.build, "apps", "dflash_mpi"), os.path.join(A.src, "mpi_launch", "configs", "tiny.yaml"),
           "--set", f"target.path={tiny}", "--set", f"data.path={data}", "--set", f"run.out_dir={out}",
           "--set", "run.steps=4", "--set", "log.every=1", "--set", "optim.micro_batches=1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print(p.stdout[-3000:] + p.stderr[-3000:])
    expect(p.returncode == 0, f"dflash_mpi exited {p.returncode}")
    metrics = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    losses = [m["loss"] for m in metrics if "loss" in m]
    expect(len(losses) == 4 and all(np.isfinite(losses)) and losses[0] > 0, f"losses {losses}")
    expect(os.path.exists(os.path.join(out, "drafter_final.safetensors")), "no final weights")
    print(f"PASS (trains): losses {losses}")


def case_prompts():
    """dflash-prep prompts (and dflash_data import-prompts, which runs it): each row's prompt key gives exactly the
    ids of apply_chat_template(add_generation_prompt=True), loss_mask 0; bad rows fail naming file, line, key."""
    tok_dir, tok = make_tokenizer()
    rows = [{"prompt": "def add(a, b):\n    return"},                                   # HumanEval
            {"question": "What is two plus two?", "answer": "four"},                     # GSM8K
            {"turns": ["Tell me a story.", "Make it shorter."], "category": "writing"},  # MT-Bench
            {"messages": [{"role": "system", "content": "Be short."}, {"role": "user", "content": "Hello"},
                          {"role": "assistant", "content": "I am fine."}]},               # a chat training row
            {"prompt": "Hi", "question": "ignored", "system": "Be short."}]
    want_msgs = [[{"role": "user", "content": rows[0]["prompt"]}],
                 [{"role": "user", "content": rows[1]["question"]}],
                 [{"role": "user", "content": "Tell me a story."}],
                 [{"role": "system", "content": "Be short."}, {"role": "user", "content": "Hello"}],
                 [{"role": "system", "content": "Be short."}, {"role": "user", "content": "Hi"}]]
    src = write_jsonl("prompts.jsonl", rows)
    out = os.path.join(A.work, "prompts.h5")
    prep("prompts", src, "--tokenizer", tok_dir, "--out", out, pattern="5 prompts")
    seqs = read_h5(out)
    expect(len(seqs) == 5, f"{len(seqs)} prompts")
    for i, ((t, m), msg) in enumerate(zip(seqs, want_msgs)):
        want = tok.apply_chat_template(msg, tokenize=True, add_generation_prompt=True)
        want = list(want["input_ids"] if hasattr(want, "keys") else want)
        print(f"prompt {i}: {tok.decode(t)!r}")
        expect(t.tolist() == want, f"prompt {i}: ids {t.tolist()} != apply_chat_template's {want}")
        expect(not m.any(), f"prompt {i}: loss_mask is not 0 everywhere")
        expect(tok.decode(t).endswith("<|im_start|>assistant\n"), f"prompt {i}: no generation prompt at the end")
    # template kwargs reach the template (the fixture's template opens an empty think block without thinking)
    out_nt = os.path.join(A.work, "prompts_nothink.h5")
    prep("prompts", src, "--tokenizer", tok_dir, "--out", out_nt, "--template-kwargs", '{"enable_thinking": false}')
    t0 = read_h5(out_nt)[0][0]
    want = tok.apply_chat_template(want_msgs[0], tokenize=True, add_generation_prompt=True, enable_thinking=False)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    expect(t0.tolist() == want and "</think>" in tok.decode(t0), f"enable_thinking=false: {tok.decode(t0)!r}")
    # dflash_data import-prompts runs the same tool: the same prompts
    out_cpp = os.path.join(A.work, "prompts_cpp.h5")
    env = {k: v for k, v in os.environ.items() if k != "DFLASH_PREP"}
    env.setdefault("DFLASH_PREP_VENV", os.path.join(A.src, "data", "prep", ".venv"))
    p = subprocess.run([os.path.join(A.build, "apps", "dflash_data"), "import-prompts", src, "--tokenizer", tok_dir,
                        "--out", out_cpp], capture_output=True, text=True, env=env)
    print(p.stdout + p.stderr)
    expect(p.returncode == 0, f"dflash_data import-prompts exited {p.returncode}")
    expect([t.tolist() for t, _ in read_h5(out_cpp)] == [t.tolist() for t, _ in seqs], "import-prompts differs")
    p = subprocess.run([os.path.join(A.build, "apps", "dflash_data"), "inspect", out, "--vocab", "512"],
                       capture_output=True, text=True)
    expect(p.returncode == 0 and re.search(r"valid\s+yes", p.stdout), f"inspect refused the prompts: {p.stdout}")
    # bad rows: every one reported with file:line and the key, nothing written
    bad = [rows[0], '{"prompt": ', {"turns": []}, {"prompt": 3}, {"text": "no prompt key"},
           {"messages": [{"role": "assistant", "content": "only an answer"}]}, {"question": "   "},
           {"messages": [{"role": "tool", "content": "x"}]}]
    src_bad = write_jsonl("bad.jsonl", bad)
    out_bad = os.path.join(A.work, "bad.h5")
    o = prep("prompts", src_bad, "--tokenizer", tok_dir, "--out", out_bad, rc=1, pattern="7 bad rows, nothing written")
    for line, text in ((2, "not valid JSON"), (3, "'turns' must be a list"), (4, "'prompt' must be a non-empty string"),
                       (5, "none of the keys 'messages', 'turns', 'prompt', 'question'; keys: text"),
                       (6, "'messages' has no user turn"), (7, "'question' must be a non-empty string"),
                       (8, "messages[0] must be an object with a role")):
        expect(f"bad.jsonl:{line}: {text}" in o, f"line {line} not reported as {text!r}")
    expect(not os.path.exists(out_bad) and not os.path.exists(out_bad + ".partial"), "a failed run left a file")
    prep("prompts", os.path.join(A.work, "missing.jsonl"), "--tokenizer", tok_dir, "--out", out_bad, rc=1,
         pattern="missing.jsonl not found")
    target = os.path.join(A.work, "target")
    os.makedirs(target, exist_ok=True)
    json.dump({"vocab_size": 300, "eos_token_id": tok.convert_tokens_to_ids("<|im_end|>")},
              open(os.path.join(target, "config.json"), "w"))
    prep("prompts", src, "--tokenizer", tok_dir, "--out", out_bad, "--target", target, rc=1,
         pattern="has 400 tokens but the target")
    prep("prompts", src, "--tokenizer", tok_dir, "--out", out_bad, "--max-len", 5, rc=1, pattern="> --max-len 5")
    print("PASS (prompts)")


CASE_MODULES = (cases_tools, cases_hostile, cases_faults, cases_package)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--src", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    vars(A).update(vars(ap.parse_args()))
    A.work = os.path.join(A.work, A.case)
    shutil.rmtree(A.work, ignore_errors=True)
    os.makedirs(A.work)
    name = "case_" + A.case
    for module in (sys.modules[__name__],) + CASE_MODULES:
        if hasattr(module, name):
            return getattr(module, name)()
    fail(f"no case {A.case!r}")


if __name__ == "__main__":
    main()
