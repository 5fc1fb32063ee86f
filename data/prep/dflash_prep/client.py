"""An OpenAI-compatible server (vLLM, SGLang, transformers serve) as 'dflash-prep regenerate' uses it:
GET /v1/models and POST /v1/chat/completions, with retries, and every answer checked before it is used.

What can go wrong with a request, and what happens:
  - HTTP 401/403/404: wrong URL, key or model; every row would fail the same way   -> ServerDown at once
  - another HTTP 4xx: the server refuses this prompt (e.g. too long)                 -> Reject (the row)
  - connection refused or reset, timeout, HTTP 408/409/425/429/5xx                    -> retried; then ServerDown
  - an answer that is not what the API promises: not JSON (an HTML error page), a
    body cut off, 'choices' missing or of the wrong type, 'message' not an object,
    content not a string                                                              -> retried; then BadAnswer
Retries: --retries attempts in all, waiting --retry-wait seconds before the second, doubling up to 30 s, with
jitter so that concurrent requests do not retry in lockstep."""
import http.client
import json
import random
import time
import urllib.error
import urllib.request

from .jsonfile import JsonError, json_type, parse_json, short
from .rows import Reject

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_WAIT = 30.0


class ServerDown(Exception):
    """The server is unreachable, keeps failing, or refuses every request: its rows go to the other servers."""


class BadAnswer(Exception):
    """The server answered, but not with a usable answer (after the retries); str() names the URL and the fault."""


def chat_answer(resp) -> tuple:
    """(assistant message for the row, finish_reason, generated tokens) of a chat completion; raises BadAnswer
    naming what is wrong. Only what the row needs must be right; usage and finish_reason are statistics and a
    server that omits them or sends odd values is still used."""
    if not isinstance(resp, dict):
        raise BadAnswer(f"the answer is a JSON {json_type(resp)}, not an object: {short(resp)}")
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BadAnswer(f"no 'choices' list in the answer: {short(resp, 200)}")
    choice = choices[0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise BadAnswer(f"choices[0].message is not an object: {short(choice, 200)}")
    content = msg.get("content")
    if content is not None and not isinstance(content, str):
        raise BadAnswer(f"choices[0].message.content is a {json_type(content)}, not a string: {short(content)}")
    out = {"role": "assistant", "content": content or ""}
    reasoning = msg.get("reasoning_content", msg.get("reasoning"))   # servers with a reasoning parser
    if reasoning is not None and not isinstance(reasoning, str):
        raise BadAnswer(f"choices[0].message.reasoning_content is a {json_type(reasoning)}, not a string")
    if reasoning:
        out["reasoning_content"] = reasoning
    tool_calls = msg.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise BadAnswer(f"choices[0].message.tool_calls is a {json_type(tool_calls)}, not a list")
    if tool_calls:
        out["tool_calls"] = tool_calls
    finish = choice.get("finish_reason")
    usage = resp.get("usage")
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return out, finish if isinstance(finish, str) else None, n if isinstance(n, int) and n >= 0 else 0


def model_ids(resp) -> list:
    """The model names of a GET /v1/models answer; raises BadAnswer."""
    data = resp.get("data") if isinstance(resp, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise BadAnswer(f"not a model list {{\"data\": [{{\"id\": ...}}]}}: {short(resp, 200)}")
    return [m["id"] for m in data]


class Client:
    def __init__(self, base: str, api_key: str, timeout: float, retries: int, retry_wait: float):
        base = base.rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout, self.retries, self.retry_wait = timeout, retries, retry_wait

    def _fetch(self, url: str, data):
        """The decoded JSON of one request; raises HTTPError / OSError / HTTPException, or BadAnswer."""
        req = urllib.request.Request(url, data=data, headers=self.headers, method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            try:
                body = resp.read()
            except http.client.IncompleteRead as e:
                raise BadAnswer(f"the answer was cut off ({len(e.partial)} bytes of "
                                f"{len(e.partial) + (e.expected or 0)})") from None
        try:
            return parse_json(body)
        except JsonError as e:
            raise BadAnswer(f"the answer is {e}; it begins {short(body[:80].decode('utf-8', 'replace'))}") from None

    def call(self, path: str, body, check):
        """check(decoded answer) of a request, retried; raises Reject, ServerDown or BadAnswer (see above)."""
        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        wait = self.retry_wait
        for attempt in range(1, self.retries + 1):
            try:
                return check(self._fetch(url, data))
            except urllib.error.HTTPError as e:
                try:
                    detail = e.read().decode("utf-8", "replace")[:300]
                except (OSError, http.client.HTTPException):   # an error page cut off: the status says enough
                    detail = ""
                if e.code in (401, 403, 404):
                    raise ServerDown(f"HTTP {e.code} from {url}: {detail}") from None
                if e.code not in RETRY_STATUS:
                    raise Reject("server_refused", f"HTTP {e.code} from {url}: {detail}") from None
                fault, why = ServerDown, f"HTTP {e.code}: {detail}"
            except BadAnswer as e:
                fault, why = BadAnswer, str(e)
            except (OSError, http.client.HTTPException) as e:   # refused, reset, timeout, no status line
                fault, why = ServerDown, str(getattr(e, "reason", None) or e) or type(e).__name__
            if attempt == self.retries:
                raise fault(f"{url}: {why} (after {self.retries} attempts)")
            time.sleep(wait * (0.5 + random.random()))
            wait = min(wait * 2, MAX_WAIT)

    def models(self) -> list:
        return self.call("/v1/models", None, model_ids)

    def chat(self, body: dict) -> tuple:
        return self.call("/v1/chat/completions", body, chat_answer)
