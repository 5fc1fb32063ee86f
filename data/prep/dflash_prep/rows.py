"""Input rows: jsonl lines in one of three formats, normalised to a list of turns.

Formats (one JSON object per line; blank lines are skipped):
  OpenAI   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
           with tools: an assistant message may carry "tool_calls" (its content may then be null), "tool"
           messages answer them, and an optional top-level "tools" list holds the function definitions
  ShareGPT {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
           (an optional top-level "system" string becomes the first turn)
  text     {"text": "..."}  plain text, no chat template, every token trained
A row that fits none of them, or has a field of the wrong type, raises Reject with the reason and the field; the
caller adds file and line.
"""
from dataclasses import dataclass, field
import os
from typing import Iterator, Optional

from .jsonfile import JsonError, json_type, parse_json, short

# ShareGPT "from" values and their chat roles
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "model": "assistant",
}
CHAT_ROLES = ("system", "user", "assistant")
MESSAGE_ROLES = CHAT_ROLES + ("tool",)   # OpenAI rows: "tool" messages answer an assistant's tool_calls
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Reject(Exception):
    """A row that cannot be used. `reason` is a short key for the statistics, the message says what is wrong."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Turn:
    role: str                          # system | user | assistant | tool
    content: str                       # for assistant turns: the answer, without the reasoning
    reasoning: Optional[str] = None    # assistant turns: the <think> text, None when there is none
    extra: dict = field(default_factory=dict)   # the message's other fields (tool_calls, name, tool_call_id, ...),
    #                                            handed to the chat template with role and content

    @property
    def tool_calls(self) -> list:
        return self.extra.get("tool_calls") or []


@dataclass
class Row:
    line: int                          # 1-based line number in its file
    turns: list = field(default_factory=list)   # [Turn]; empty for a text row
    text: Optional[str] = None         # plain-text rows
    raw: Optional[dict] = None         # the parsed object (kept for the rejects file and regeneration)
    tools: Optional[list] = None       # the row's "tools" (function definitions for the chat template)


def split_reasoning(content: str, reasoning_field: Optional[str]):
    """(reasoning, answer) of an assistant message, the way Qwen3's chat template splits it: an explicit
    reasoning_content field wins; otherwise text before '</think>' (after a leading '<think>') is the reasoning."""
    if reasoning_field is not None:
        if THINK_CLOSE in content:
            raise Reject("think_twice", "assistant turn has both a reasoning field and a </think> in its content")
        return reasoning_field.strip("\n"), content
    if THINK_CLOSE not in content:
        if THINK_OPEN in content:
            raise Reject("unclosed_think", "assistant turn has <think> without </think>")
        return None, content
    head, answer = content.split(THINK_CLOSE, 1)
    if THINK_CLOSE in answer or THINK_OPEN in answer:
        raise Reject("think_twice", "assistant turn has more than one <think> block")
    reasoning = head.split(THINK_OPEN, 1)[-1] if THINK_OPEN in head else head
    if THINK_OPEN in head and head.split(THINK_OPEN, 1)[0].strip():
        raise Reject("text_before_think", "assistant turn has text before its <think> block")
    return reasoning.strip("\n"), answer.lstrip("\n")


def _text_of(content, where: str) -> str:
    """A message content: a string, or OpenAI content parts of type text (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise Reject("bad_content", f"{where}: only text content parts are supported, got {short(p)}")
            parts.append(p["text"])
        return "".join(parts)
    raise Reject("bad_content", f"{where}: content must be a string or a list of text parts, got a "
                 f"{json_type(content)}")


# message fields the tokenizer reads itself (not handed to the template as they are)
_OWN_FIELDS = {"role", "content", "reasoning_content", "reasoning"}


def _tool_calls(calls, where: str) -> list:
    """An assistant message's tool_calls, checked: a list of {"function": {"name": str, "arguments": ...}}
    (OpenAI's form; arguments an object or its JSON text)."""
    if not isinstance(calls, list) or not calls:
        raise Reject("bad_tool_call", f"{where}: 'tool_calls' must be a non-empty list, got {short(calls)}")
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise Reject("bad_tool_call", f"{w} must be an object with a 'function' object, got {short(c)}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise Reject("bad_tool_call", f"{w}.function.name must be a non-empty string, got {short(fn.get('name'))}")
        if not isinstance(fn.get("arguments", {}), (dict, str)):
            raise Reject("bad_tool_call", f"{w}.function.arguments must be an object or a JSON string, got a "
                         f"{json_type(fn['arguments'])}")
    return calls


def _tools(tools) -> list:
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise Reject("bad_tools", f"'tools' must be a list of objects (function definitions), got {short(tools)}")
    return tools or None


def parse_turns(obj: dict) -> list:
    """The turns of an OpenAI or ShareGPT row."""
    if "messages" in obj:
        msgs, role_key, text_key, key = obj["messages"], "role", "content", "messages"
    else:
        msgs, role_key, text_key, key = obj["conversations"], "from", "value", "conversations"
    if not isinstance(msgs, list) or not msgs:
        raise Reject("empty", f"'{key}' must be a non-empty list, got {short(msgs)}")
    turns = []
    if key == "conversations" and obj.get("system") is not None:
        if not isinstance(obj["system"], str):
            raise Reject("bad_content", f"'system' must be a string, got a {json_type(obj['system'])}")
        if obj["system"]:
            turns.append(Turn("system", obj["system"]))
    for i, m in enumerate(msgs):
        where = f"{key}[{i}]"
        if not isinstance(m, dict) or role_key not in m:
            raise Reject("bad_turn", f"{where} must be an object with '{role_key}', got {short(m)}")
        raw_role = m[role_key]
        if not isinstance(raw_role, str):
            raise Reject("bad_turn", f"{where}.{role_key} must be a string, got a {json_type(raw_role)}: "
                         f"{short(raw_role)}")
        role = SHAREGPT_ROLES.get(raw_role) if key == "conversations" else raw_role
        if role not in (CHAT_ROLES if key == "conversations" else MESSAGE_ROLES):
            raise Reject("unknown_role", f"{where}: role '{raw_role}' is not supported (system, user, assistant"
                         + (", or ShareGPT human/gpt" if key == "conversations" else ", tool") + ")")
        extra = {k: v for k, v in m.items() if k not in _OWN_FIELDS} if key == "messages" else {}
        if role == "assistant" and "tool_calls" in extra:
            if extra["tool_calls"] is None:
                del extra["tool_calls"]
            else:
                _tool_calls(extra["tool_calls"], where)
        if role == "tool" and not (turns and (turns[-1].role == "tool" or turns[-1].tool_calls)):
            raise Reject("bad_tool", f"{where}: a 'tool' message must answer an assistant turn with tool_calls "
                         "(directly after it, or after other tool messages)")
        # OpenAI writes "content": null beside tool calls
        if m.get(text_key) is None and not (role == "assistant" and extra.get("tool_calls")):
            raise Reject("bad_content", f"{where}: no '{text_key}'")
        text = _text_of(m[text_key], where) if m.get(text_key) is not None else ""
        if role == "assistant":
            rf = m.get("reasoning_content", m.get("reasoning"))
            if rf is not None and not isinstance(rf, str):
                raise Reject("bad_content", f"{where}: reasoning_content must be a string, got a {json_type(rf)}")
            try:
                reasoning, answer = split_reasoning(text, rf)
            except Reject as e:
                raise Reject(e.reason, f"{where}: {e}") from None
            turns.append(Turn("assistant", answer, reasoning, extra))
        else:
            turns.append(Turn(role, text, extra=extra))
    return turns


def load_row_json(line: str):
    """The JSON value of an input line; raises Reject (bad_json) for anything json.loads cannot use."""
    try:
        return parse_json(line)
    except JsonError as e:
        raise Reject("bad_json", str(e)) from None


def parse_row(line_no: int, line: str) -> Row:
    obj = load_row_json(line)
    if not isinstance(obj, dict):
        raise Reject("bad_json", f"a row must be a JSON object, got a {json_type(obj)}")
    if "messages" in obj or "conversations" in obj:
        tools = None
        if obj.get("tools") is not None:
            if "messages" not in obj:
                raise Reject("bad_tools", "'tools' needs an OpenAI 'messages' row (ShareGPT turns carry no tool calls)")
            tools = _tools(obj["tools"])
        return Row(line_no, turns=parse_turns(obj), raw=obj, tools=tools)
    if "text" in obj:
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise Reject("bad_content", "'text' must be a non-empty string")
        return Row(line_no, text=obj["text"], raw=obj)
    raise Reject("unknown_format", "no 'messages' (OpenAI), 'conversations' (ShareGPT) or 'text' key; keys: "
                 + ", ".join(sorted(obj)[:8]))


def json_object_arg(text: str, name: str) -> dict:
    """A command-line option that holds a JSON object (e.g. --template-kwargs), or exit naming the option."""
    try:
        v = parse_json(text)
    except JsonError:
        v = None
    if not isinstance(v, dict):
        raise SystemExit(f"error: {name} must be a JSON object, got {text!r}")
    return v


def require_input_files(paths) -> None:
    """Exit naming the first input file that does not exist, before any work starts."""
    for path in paths:
        if not os.path.isfile(path):
            raise SystemExit(f"error: input file {path} not found")


def read_lines(path: str) -> Iterator:
    """(line number, line) for every non-blank line of a jsonl file. Invalid UTF-8 is an error naming the line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield n, Reject("bad_utf8", f"not valid UTF-8 at byte {e.start}")
                continue
            if line.strip():
                yield n, line
