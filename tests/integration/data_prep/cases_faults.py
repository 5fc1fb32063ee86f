"""Cases regenerate_hostile and regenerate_servers: 'regenerate' against servers that answer garbage or die
(server.py's HOSTILE answers, /garbage and /models-* variants, --exit-after). A malformed answer is retried, then
the row is recorded as failed with the URL and what was wrong, and the run goes on; several --server share the
rows, a failed server's rows go to the others, and the output is the same as with one good server."""
import json
import os
import re

from harness import A, expect, make_tokenizer, msgs, prep, regen_rows, start_server, write_jsonl

FAST = ["--retries", 2, "--retry-wait", 0.05]   # retries that do not slow the test down

# row text marker -> what the failure message must say (server.py HOSTILE)
BAD = {"html": "not valid JSON", "notjson": "not valid JSON", "truncated": "the answer was cut off",
       "message_string": "choices[0].message is not an object", "no_choices": "no 'choices' list",
       "choices_dict": "no 'choices' list", "content_list": "message.content is a list, not a string",
       "list": "the answer is a JSON list, not an object", "deep": "nested too deeply"}


def case_regenerate_hostile():
    tok_dir, _ = make_tokenizer()
    proc, url = start_server(tok_dir, "hostile")
    try:
        rows = [msgs(("user", "Hello, how are you?"))]
        rows += [msgs(("user", f"Tell me a story HOSTILE_{k}")) for k in BAD]
        rows += [msgs(("user", "Tell me a story HOSTILE_flaky")),      # bad once, then good: retried
                 msgs(("user", "Tell me a story HOSTILE_odd_usage")),  # odd statistics: still used
                 msgs(("user", "What is the capital of France?"))]
        src = write_jsonl("hostile.jsonl", rows)
        out = os.path.join(A.work, "out.jsonl")
        n_bad = len(BAD)
        o = prep("regenerate", src, "--server", url, "--out", out, "--max-tokens", 8, *FAST, rc=1,
                 pattern=f"{n_bad} rows rejected ({n_bad} failed: no usable answer from the servers)")
        for line, (kind, want) in enumerate(BAD.items(), start=2):
            m = re.search(rf"hostile.jsonl:{line}: bad_response: no usable answer: (.*)", o)
            expect(m and f"{url}/v1/chat/completions: " in m.group(1) and want in m.group(1)
                   and "(after 2 attempts)" in m.group(1), f"line {line} ({kind}): {m and m.group(1)!r}")
        # the good rows are in the journal; skip writes them and the failed rows' file
        o = prep("regenerate", src, "--server", url, "--out", out, "--max-tokens", 8, *FAST, "--on-reject", "skip",
                 pattern="resuming: 4 rows already in")
        expect(f"wrote {out}: 4 rows (of {len(rows)} input rows, {n_bad} rejected, {n_bad} of them failed)" in o,
               "summary")
        rej = [json.loads(x) for x in open(os.path.join(A.work, "out.rejects.jsonl"))]
        expect([r["reason"] for r in rej] == ["bad_response"] * n_bad and all(url in r["message"] for r in rej),
               f"rejects file: {rej}")
        # model lists of the wrong type: a clear error naming the URL (or --model works around it)
        for variant, want in (("list", "not a model list"), ("dict", "not a model list"),
                              ("strings", "not a model list"), ("html", "not valid JSON"),
                              ("empty", "lists no model")):
            base = f"{url}/models-{variant}"
            o = prep("regenerate", src, "--server", base, "--out", os.path.join(A.work, "m.jsonl"), *FAST, rc=1,
                     pattern=f"cannot list the server's models: {base}/v1/models")
            expect(want in o, f"models-{variant}: no {want!r}")
    finally:
        proc.terminate()
    print("PASS (regenerate_hostile)")


def case_regenerate_servers():
    tok_dir, _ = make_tokenizer()
    rows = regen_rows(12)
    src = write_jsonl("prompts.jsonl", rows)
    a, url_a = start_server(tok_dir, "a")
    b, url_b = start_server(tok_dir, "b", delay=0.05)
    dying, url_dying = start_server(tok_dir, "dying", exit_after=1)
    try:
        common = ["--max-tokens", 16, "--concurrency", 2, *FAST]
        ref = os.path.join(A.work, "ref.jsonl")
        prep("regenerate", src, "--server", url_a, "--out", ref, *common, pattern=f"wrote {ref}: 12 rows")
        want = open(ref).read()

        def run(name, *servers, **kw):
            out = os.path.join(A.work, name + ".jsonl")
            o = prep("regenerate", src, *[x for s in servers for x in ("--server", s)], "--out", out, *common, **kw)
            return o, open(out).read()

        # two servers share the rows; the output is the one server's, in input order
        o, got = run("two", url_a, url_b, pattern="rows per server:")
        counts = dict(re.findall(r"(http://\S+) (\d+)", o.split("rows per server:")[1]))
        expect(got == want, "two servers: the output differs from one server's")
        expect(all(int(counts.get(u, 0)) > 0 for u in (url_a, url_b)), f"the rows were not spread: {counts}")
        # a server that dies at its second request: its rows go to the other one, nothing is lost or duplicated
        o, got = run("dying", url_dying, url_a, pattern=f"warning: server {url_dying} failed")
        expect(got == want, "a dying server: the output differs from one server's")
        # a server whose every answer is garbage: each of its rows is tried on the other server
        o, got = run("garbage", url_a + "/garbage", url_b)
        expect(got == want, "a garbage server: the output differs from one server's")
        expect(f"{url_a}/garbage 0" in o, "the garbage server was counted as generating rows")
        # every server down: the run stops with the reason, the journal keeps what was done
        prep("regenerate", src, "--server", url_dying, "--server", url_a + "/no/such", "--model",
             "tiny-trigram", "--out", os.path.join(A.work, "down.jsonl"), *common, rc=1, pattern="no server is left")
    finally:
        for p in (a, b, dying):
            p.terminate()
    print("PASS (regenerate_servers)")
