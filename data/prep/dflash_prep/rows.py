"""Input rows: jsonl lines in one of three formats, normalised to a list of turns.

Formats (one JSON object per line; blank lines are skipped):
  OpenAI   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
  ShareGPT {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
           (an optional top-level "system" string becomes the first turn)
  text     {"text": "..."}  plain text, no chat template, every token trained
A row that fits none of them, or has a bad field, raises Reject with the reason; the caller adds file and line.
"""
from dataclasses import dataclass, field
import json
import os
from typing import Iterator, Optional

# ShareGPT "from" values and their chat roles
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "model": "assistant",
}
CHAT_ROLES = ("system", "user", "assistant")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Reject(Exception):
    """A row that cannot be used. `reason` is a short key for the statistics, the message says what is wrong."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Turn:
    role: str                          # system | user | assistant
    content: str                       # for assistant turns: the answer, without the reasoning
    reasoning: Optional[str] = None    # assistant turns: the <think> text, None when there is none


@dataclass
class Row:
    line: int                          # 1-based line number in its file
    turns: list = field(default_factory=list)   # [Turn]; empty for a text row
    text: Optional[str] = None         # plain-text rows
    raw: Optional[dict] = None         # the parsed object (kept for the rejects file and regeneration)


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
                raise Reject("bad_content", f"{where}: only text content parts are supported, got {json.dumps(p)[:80]}")
            parts.append(p["text"])
        return "".join(parts)
    raise Reject("bad_content", f"{where}: content must be a string, got {type(content).__name__}")


def parse_turns(obj: dict) -> list:
    """The turns of an OpenAI or ShareGPT row."""
    if "messages" in obj:
        msgs, role_key, text_key, key = obj["messages"], "role", "content", "messages"
    else:
        msgs, role_key, text_key, key = obj["conversations"], "from", "value", "conversations"
    if not isinstance(msgs, list) or not msgs:
        raise Reject("empty", f"'{key}' must be a non-empty list")
    turns = []
    if key == "conversations" and isinstance(obj.get("system"), str) and obj["system"]:
        turns.append(Turn("system", obj["system"]))
    for i, m in enumerate(msgs):
        where = f"{key}[{i}]"
        if not isinstance(m, dict) or role_key not in m:
            raise Reject("bad_turn", f"{where} must be an object with '{role_key}'")
        raw_role = m[role_key]
        role = SHAREGPT_ROLES.get(raw_role) if key == "conversations" else raw_role
        if role not in CHAT_ROLES:
            raise Reject("unknown_role", f"{where}: role '{raw_role}' is not supported (system, user, assistant"
                         + (", or ShareGPT human/gpt" if key == "conversations" else "") + ")")
        if text_key not in m or m[text_key] is None:
            raise Reject("bad_content", f"{where}: no '{text_key}'")
        text = _text_of(m[text_key], where)
        if role == "assistant":
            rf = m.get("reasoning_content", m.get("reasoning"))
            if rf is not None and not isinstance(rf, str):
                raise Reject("bad_content", f"{where}: reasoning_content must be a string")
            try:
                reasoning, answer = split_reasoning(text, rf)
            except Reject as e:
                raise Reject(e.reason, f"{where}: {e}") from None
            turns.append(Turn("assistant", answer, reasoning))
        else:
            turns.append(Turn(role, text))
    return turns


def parse_row(line_no: int, line: str) -> Row:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise Reject("bad_json", f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise Reject("bad_json", "a row must be a JSON object")
    if "messages" in obj or "conversations" in obj:
        return Row(line_no, turns=parse_turns(obj), raw=obj)
    if "text" in obj:
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise Reject("bad_content", "'text' must be a non-empty string")
        return Row(line_no, text=obj["text"], raw=obj)
    raise Reject("unknown_format", "no 'messages' (OpenAI), 'conversations' (ShareGPT) or 'text' key; keys: "
                 + ", ".join(sorted(obj)[:8]))


def json_object_arg(text: str, name: str) -> dict:
    """A command-line option that holds a JSON object (e.g. --template-kwargs), or exit naming the option."""
    try:
        v = json.loads(text)
        assert isinstance(v, dict)
        return v
    except (json.JSONDecodeError, AssertionError):
        raise SystemExit(f"error: {name} must be a JSON object, got {text!r}") from None


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
