"""A conversation -> the target's token ids and the assistant-only loss mask.

The conversation is rendered once with the target's own chat template (transformers' apply_chat_template, the
jinja2 template in the model directory) and tokenized once with its tokenizer; the loss mask is then found on
that very text, so the tokens are exactly what the target sees and the mask can only differ in which tokens it
marks, never in the tokens themselves.

Mask convention (data/README.md, "Preparing chat data"): per assistant turn, loss_mask = 1 on
  - the reasoning block '<think>...</think>' when reasoning is kept and the template renders it for that turn,
  - the answer's tokens (a token counts when its characters overlap the answer's text),
  - the tokens after the answer up to and including the first special token (the end-of-turn token, e.g.
    <|im_end|>); only whitespace or '</think>' may lie in between.
Everything else (system, user, the template's role headers, an empty '<think>\n\n</think>' the template adds
in non-thinking mode, the newline after <|im_end|>) has loss_mask = 0.

Tool calls: the template gets the whole messages (tool_calls, tool messages, name, ...) and the row's "tools",
as a serving engine hands them over. An assistant turn's tool calls are trained like its answer: their rendering
is found by rendering the conversation once more without that turn's tool_calls and comparing the two token
sequences (the tokens that differ are the template's tool-call text, whatever its format). A template that
renders no tool calls, no tool result or no tool definitions rejects the row instead of training it wrong.
"""
from dataclasses import dataclass, field
import json
import re

import numpy as np

from .rows import Reject, Row, THINK_CLOSE, THINK_OPEN

# between the end of an answer and the end-of-turn token only these may occur
_GAP_RE = re.compile(r"^(\s|</think>)*$")
MAX_GAP_TOKENS = 8


@dataclass
class Encoded:
    tokens: np.ndarray          # int32 [S]
    loss_mask: np.ndarray       # uint8 [S]
    reasoning_dropped: int = 0  # assistant turns whose kept reasoning the template did not render
    eot: list = field(default_factory=list)  # the end-of-turn token of each assistant turn


def load_tokenizer(model_dir: str):
    """The tokenizer (and chat template) of a Hugging Face model directory, without network access."""
    from transformers import AutoTokenizer  # slow import: only when needed
    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # transformers raises OSError / ValueError with its own text
        raise SystemExit(f"error: cannot load a tokenizer from '{model_dir}': {e}\n"
                         "  (the directory needs tokenizer.json and tokenizer_config.json, as in the model's "
                         "Hugging Face repository)") from None


class ChatEncoder:
    """Renders and tokenizes rows for one tokenizer. think: 'keep' or 'drop' the assistant reasoning."""

    def __init__(self, tokenizer, think: str = "keep", template_kwargs: dict = None):
        self.tok = tokenizer
        self.think = think
        self.template_kwargs = dict(template_kwargs or {})
        # special tokens (added tokens flagged special): candidates for the end-of-turn token
        self.special_ids = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.special_texts = sorted({tokenizer.added_tokens_decoder[i].content for i in self.special_ids},
                                    key=len, reverse=True)

    def template_messages(self, row: Row) -> list:
        """The messages handed to the chat template: each message's own fields (tool_calls, name, ...) with role
        and content. Kept reasoning goes back into the content in the form Qwen3 generates it
        ('<think>\\nR\\n</think>\\n\\nanswer'); Qwen3's template splits it out again itself."""
        msgs = []
        for t in row.turns:
            content = t.content
            if t.role == "assistant" and self.think == "keep" and t.reasoning:
                content = f"{THINK_OPEN}\n{t.reasoning}\n{THINK_CLOSE}\n\n{t.content}"
            msgs.append(dict(t.extra, role=t.role, content=content))
        return msgs

    def render(self, msgs: list, tools) -> str:
        kwargs = dict(self.template_kwargs)
        if tools:
            kwargs["tools"] = tools
        try:
            return self.tok.apply_chat_template(msgs, tokenize=False, **kwargs)
        except Exception as e:  # the template's raise_exception (e.g. roles must alternate) and jinja errors
            raise Reject("template_error", f"the chat template refused the conversation: {e}") from None

    def encode(self, row: Row) -> Encoded:
        if row.text is not None:
            ids = self.tok(row.text, add_special_tokens=False)["input_ids"]
            return Encoded(np.asarray(ids, np.int32), np.ones(len(ids), np.uint8))
        if not any(t.role == "assistant" for t in row.turns):
            raise Reject("no_assistant", "no assistant turn: nothing to train on (a prompt-only row needs "
                         "'dflash-prep regenerate' first)")
        if self.tok.chat_template is None:
            raise SystemExit("error: the tokenizer has no chat template (tokenizer_config.json 'chat_template' or "
                             "chat_template.jinja); chat rows need the target's template")
        msgs = self.template_messages(row)
        text = self.render(msgs, row.tools)
        if row.tools and self.render(msgs, None) == text:
            raise Reject("tools_not_rendered", "the row has 'tools' but the chat template does not render them "
                         "(it ignores the 'tools' variable): use the target's tool-aware template, or drop the rows")
        ids, offsets = self._tokenize(text)
        mask = np.zeros(len(ids), np.uint8)
        out = Encoded(ids, mask)
        cursor = 0          # everything before it belongs to turns already placed
        n_assistant = 0
        for i, t in enumerate(row.turns):
            if t.role != "assistant":
                # advance past this turn's text, so an answer that repeats the question is not found in it
                needle = t.content.strip()
                p = text.find(needle, cursor) if needle else -1
                if p >= 0:
                    cursor = p + len(needle)
                elif t.role == "tool" and needle:
                    raise Reject("tool_not_rendered", f"messages[{i}]: the chat template does not render this tool "
                                 "result as it is: use the target's tool-aware template, or drop the rows")
                continue
            n_assistant += 1
            if t.tool_calls:
                start, end = self._locate_tool_calls(text, ids, offsets, msgs, row.tools, i, t, cursor, n_assistant,
                                                     out)
            else:
                start, end = self._locate(text, t, cursor, n_assistant, out)
            cursor = self._mask_span(text, ids, offsets, start, end, mask, n_assistant, out)
        return out

    def _tokenize(self, text: str):
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], np.int32)
        offsets = np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2)   # [S, 2] char span of each token
        return ids, offsets

    def _locate_tool_calls(self, text, ids, offsets, msgs, tools, i, t, cursor, k, out: Encoded):
        """Character span [start, end) of assistant turn k (message i, with tool_calls) before its end-of-turn
        token: its reasoning and answer as in _locate, and the tokens that change when its tool_calls are left
        out of the conversation (the template's rendering of the calls)."""
        without = list(msgs)
        without[i] = {key: v for key, v in msgs[i].items() if key != "tool_calls"}
        other, _ = self._tokenize(self.render(without, tools))
        n = min(len(ids), len(other))
        head = np.nonzero(ids[:n] != other[:n])[0]
        first = int(head[0]) if len(head) else n                        # tokens before it: the same in both
        m = n - first
        tail = np.nonzero(ids[::-1][:m] != other[::-1][:m])[0]
        last = len(ids) - (int(tail[0]) if len(tail) else m)          # ids[first:last]: the tool calls' tokens
        if last <= first:
            raise Reject("tool_calls_not_rendered", f"assistant turn {k}: the chat template does not render its "
                         "tool_calls: use the target's tool-aware template, or drop the rows")
        if offsets[first, 0] < cursor or np.any(np.isin(ids[first:last], list(self.special_ids))):
            # a template whose rendering changes elsewhere too (other turns, across end-of-turn tokens)
            raise Reject("tool_calls_not_rendered", f"assistant turn {k}: cannot tell its tool calls apart in the "
                         "rendered chat (leaving them out changes more than this turn)")
        start, end = int(offsets[first, 0]), int(offsets[last - 1, 1])
        answer = t.content.strip()
        if answer:
            a = text.find(answer, cursor, end)
            if a < 0:
                raise Reject("answer_not_rendered", f"assistant turn {k}: its text is not in the rendered chat "
                             "template (the template changes or drops it)")
            start, end = min(start, a), max(end, a + len(answer))
        reasoning = (t.reasoning or "").strip() if self.think == "keep" else ""
        if reasoning:
            r = text.find(reasoning, cursor, start)
            if r >= 0:
                o = text.rfind(THINK_OPEN, cursor, r)
                start = o if o >= 0 else r
            else:
                out.reasoning_dropped += 1
        return start, end

    def _locate(self, text: str, t, cursor: int, k: int, out: Encoded):
        """Character span [start, end) of assistant turn k's trained text before its end-of-turn token."""
        answer = t.content.strip()
        reasoning = (t.reasoning or "").strip() if self.think == "keep" else ""
        if answer:
            a = self._find_before_eot(text, answer, cursor)
            if a < 0:
                raise Reject("answer_not_rendered", f"assistant turn {k}: its text is not in the rendered chat "
                             "template followed by an end-of-turn token (the template changes or drops it)")
            start, end = a, a + len(answer)
            if reasoning:
                r = text.find(reasoning, cursor, a)
                if r >= 0:
                    o = text.rfind(THINK_OPEN, cursor, r)
                    start = o if o >= 0 else r
                else:
                    out.reasoning_dropped += 1   # e.g. Qwen3 renders no reasoning for turns before the last query
            return start, end
        if not reasoning:
            raise Reject("empty_answer", f"assistant turn {k} is empty")
        r = text.find(reasoning, cursor)
        if r < 0:
            raise Reject("answer_not_rendered", f"assistant turn {k}: it has only reasoning and the template does "
                         "not render it")
        o = text.rfind(THINK_OPEN, cursor, r)
        return (o if o >= 0 else r), r + len(reasoning)

    def _find_before_eot(self, text: str, needle: str, cursor: int) -> int:
        """First occurrence of needle at or after cursor that only whitespace separates from a special token."""
        p = text.find(needle, cursor)
        while p >= 0:
            tail = text[p + len(needle):]
            stripped = tail.lstrip()
            if any(stripped.startswith(s) for s in self.special_texts):
                return p
            p = text.find(needle, p + 1)
        return -1

    def _mask_span(self, text, ids, offsets, start, end, mask, k, out: Encoded) -> int:
        """Sets mask = 1 on the tokens overlapping [start, end) and on those up to and including the end-of-turn
        token. Returns the character position after the end-of-turn token."""
        overlap = np.nonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))[0]
        if len(overlap) == 0:
            raise Reject("answer_not_rendered", f"assistant turn {k}: no token covers its text")
        first, last = overlap[0], overlap[-1]
        j = last + 1
        while j < len(ids) and int(ids[j]) not in self.special_ids:
            gap = text[offsets[j, 0]:offsets[j, 1]]
            if j - last > MAX_GAP_TOKENS or not _GAP_RE.match(gap):
                raise Reject("no_end_of_turn", f"assistant turn {k}: its text is followed by {json.dumps(gap)}, "
                             "not by an end-of-turn special token")
            j += 1
        if j == len(ids):
            raise Reject("no_end_of_turn", f"assistant turn {k}: no end-of-turn special token after its text")
        mask[first:j + 1] = 1
        out.eot.append(self.tok.convert_ids_to_tokens(int(ids[j])))
        return int(offsets[j, 1])
