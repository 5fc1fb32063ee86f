"""JSON from untrusted places (input lines, model directories, server answers, the journal) without tracebacks:
every way json.loads can fail becomes one short message.

Besides JSONDecodeError, json.loads raises RecursionError for deeply nested values ('[[[[...' 200000 deep) and
ValueError for an integer of more than 4300 digits (Python's int conversion limit)."""
import json


class JsonError(ValueError):
    """Not usable JSON; str() says why in a few words."""


def parse_json(text):
    """The value of a JSON text (str or bytes); raises JsonError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise JsonError("not usable JSON: nested too deeply (more levels than Python's JSON parser allows)") from None
    except UnicodeDecodeError as e:
        raise JsonError(f"not valid UTF-8 at byte {e.start}") from None
    except ValueError as e:   # e.g. an integer longer than Python's int conversion limit
        raise JsonError(f"not usable JSON: {e}") from None


def read_json_object(path: str, what: str) -> dict:
    """The JSON object in file path; exits naming the file and what is wrong. what: e.g. 'the target's config'."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SystemExit(f"error: cannot read {path} ({what}): {e.strerror or e}") from None
    try:
        obj = parse_json(data)
    except JsonError as e:
        raise SystemExit(f"error: {path} ({what}): {e}; the file is damaged or not a JSON file (fetch it again "
                         "from the model's repository)") from None
    if not isinstance(obj, dict):
        raise SystemExit(f"error: {path} ({what}): must hold a JSON object {{...}}, but holds a "
                         f"{json_type(obj)}") from None
    return obj


def json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    return "object" if isinstance(v, dict) else type(v).__name__


def short(v, n: int = 80) -> str:
    """A value as short JSON text for messages (never fails, even for values json cannot dump)."""
    try:
        text = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(v)
    return text if len(text) <= n else text[:n] + "..."
