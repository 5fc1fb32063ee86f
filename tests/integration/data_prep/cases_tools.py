"""Case tools: assistant turns with tool_calls, 'tool' messages and the row's 'tools' go to the chat template whole,
so that the trained tokens include the tool calls; a template that cannot render them rejects the rows by line."""
import json
import os

from harness import A, expect, make_tokenizer, masked_segments, prep, read_h5, write_jsonl

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


def call(city, as_text=False):
    args = {"city": city}
    return {"type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args) if as_text
                                             else args}}


ROWS = [
    # OpenAI's form: content null beside the tool call, the tool's result, the final answer; tools defined
    {"tools": [WEATHER],
     "messages": [{"role": "system", "content": "Be short."},
                  {"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [call("Paris")]},
                  {"role": "tool", "content": "sunny, 21 degrees"},
                  {"role": "assistant", "content": "It is sunny in Paris."}]},
    # an answer and two calls (arguments as JSON text and as an object), two results
    {"messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                  {"role": "assistant", "content": "Let me look.", "tool_calls": [call("Paris", True), call("Rome")]},
                  {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"},
                  {"role": "assistant", "content": "Paris is sunny, Rome is rainy."}]},
    # reasoning before the call (kept and trained: the turn is after the last user turn)
    {"messages": [{"role": "user", "content": "Is it cold in Oslo?"},
                  {"role": "assistant", "content": "", "reasoning_content": "I need the weather.",
                   "tool_calls": [call("Oslo")]},
                  {"role": "tool", "content": "cold"},
                  {"role": "assistant", "content": "Yes, it is cold."}]},
]
CALL = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
WANT = [[CALL.format("Paris") + "<|im_end|>", "It is sunny in Paris.<|im_end|>"],
        ["Let me look.\n" + CALL.format("Paris") + "\n" + CALL.format("Rome") + "<|im_end|>",
         "Paris is sunny, Rome is rainy.<|im_end|>"],
        ["<think>\nI need the weather.\n</think>\n\n" + CALL.format("Oslo") + "<|im_end|>",
         "Yes, it is cold.<|im_end|>"]]


def case_tools():
    tok_dir, tok = make_tokenizer("tok_tools", template="tools")
    src = write_jsonl("tools.jsonl", ROWS)
    out = os.path.join(A.work, "tools.h5")
    prep("tokenize", src, "--tokenizer", tok_dir, "--out", out, pattern="3 rows -> 3 sequences")
    seqs = read_h5(out)
    for i, ((t, m), row, want) in enumerate(zip(seqs, ROWS, WANT)):
        got = masked_segments(tok, t, m)
        print(f"sequence {i}: masked {got}")
        expect(got == want, f"sequence {i}: masked {got}, expected {want}")
        # the tokens are the template's rendering of the whole messages (tool calls, results, tools)
        conv = []
        for msg in row["messages"]:
            msg = dict(msg, content=msg["content"] or "")
            if msg.pop("reasoning_content", None):
                msg["content"] = f"<think>\nI need the weather.\n</think>\n\n{msg['content']}"
            conv.append(msg)
        rendered = tok.apply_chat_template(conv, tools=row.get("tools"), tokenize=False)
        expect(tok.decode(t) == rendered, f"sequence {i} does not decode to the rendered chat")
        expect("<tool_response>" in rendered and not any("tool_response" in s for s in got),
               f"sequence {i}: a tool result is trained")
    system_turn = tok.decode(seqs[0][0]).split("<|im_start|>user")[0]
    expect("# Tools" in system_turn and '"get_weather"' in system_turn, "the tools are not in the system turn")

    # a template that knows no tools: the rows are rejected by line, never trained without their tool calls
    plain_dir, _ = make_tokenizer("tok_plain")
    bad_rows = ROWS + [{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]},
                       {"messages": [{"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": None, "tool_calls": "get_weather()"}]}]
    bad = write_jsonl("bad.jsonl", bad_rows)
    o = prep("tokenize", bad, "--tokenizer", plain_dir, "--out", os.path.join(A.work, "bad.h5"), rc=1,
             pattern="5 rows rejected, nothing written")
    for line, reason in ((1, "tools_not_rendered"), (2, "tool_calls_not_rendered"), (3, "tool_calls_not_rendered"),
                         (4, "bad_tool: messages[0]: a 'tool' message must answer an assistant turn"),
                         (5, "bad_tool_call: messages[1]: 'tool_calls' must be a non-empty list")):
        expect(f"bad.jsonl:{line}: {reason}" in o, f"line {line} not reported as {reason}")
    # the same bad rows through the tool-aware template: only the malformed ones are rejected
    o = prep("tokenize", bad, "--tokenizer", tok_dir, "--out", os.path.join(A.work, "bad.h5"), "--on-reject", "skip",
             pattern="5 rows -> 3 sequences")
    # regenerate refuses rows with tool calls (a new answer would not match the tool results); no server needed
    o = prep("regenerate", src, "--server", "http://127.0.0.1:9", "--model", "m", "--out",
             os.path.join(A.work, "regen.jsonl"), rc=1, pattern="3 rows rejected")
    expect("tools.jsonl:1: tool_row" in o and "tools.jsonl:3: tool_row" in o, "regenerate did not refuse tool rows")
    print("PASS (tools)")
