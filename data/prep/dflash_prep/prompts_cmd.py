"""dflash_prep prompts: text prompt sets (MT-Bench, GSM8K, HumanEval style jsonl) -> an HDF5 prompt file for
dflash_eval (docs/eval.md): each row's prompt rendered with the target's chat template and the generation prompt
(apply_chat_template(add_generation_prompt=True)), tokenized with its tokenizer, loss_mask 0 on every token (so
dflash_eval's rule "the prompt is everything before the first loss_mask = 1" takes the whole sequence).

The prompt of a row, from the first of these keys it has:
  messages  OpenAI chat messages (system / user / assistant); trailing assistant turns are dropped, so a chat
            training file works too (the prompt is the conversation up to its last answer)
  turns     a list of user turns (MT-Bench); the first one is the prompt
  prompt    a string (HumanEval)
  question  a string (GSM8K)
An optional top-level "system" string becomes a system turn before it (not with "messages").
Any bad row fails the whole run with file:line: key: what is wrong, and nothing is written.
"""
import sys

import numpy as np

from . import check
from .atomic import atomic_output, check_output_path
from .h5out import DatasetWriter
from .jsonfile import json_type, short
from .options import positive_int
from .render import load_tokenizer
from .rows import CHAT_ROLES, Reject, _text_of, json_object_arg, load_row_json, read_lines, require_input_files

PROMPT_KEYS = ("messages", "turns", "prompt", "question")
MAX_PRINTED_ERRORS = 20


def add_arguments(p):
    p.add_argument("inputs", nargs="+", help="jsonl files, one prompt per line (keys: " + ", ".join(PROMPT_KEYS)
                   + "; the first present is used)")
    p.add_argument("--tokenizer", required=True, help="the target's model directory (tokenizer.json, "
                   "tokenizer_config.json with its chat template)")
    p.add_argument("--out", required=True, help="output HDF5 file (written as OUT.partial, then renamed)")
    p.add_argument("--template-kwargs", default="{}", help="JSON object passed to the chat template, e.g. "
                   "'{\"enable_thinking\": false}'")
    p.add_argument("--target", help="the target's model directory (config.json): checks the tokenizer against it "
                   "and every token id against its vocab_size")
    p.add_argument("--max-len", type=positive_int, help="longest prompt in tokens: longer rows are errors "
                   "(default: no limit)")


def _string(obj: dict, key: str) -> str:
    v = obj[key]
    if not isinstance(v, str) or not v.strip():
        raise Reject("bad_field", f"'{key}' must be a non-empty string, got {short(v, 60)}")
    return v


def prompt_messages(obj) -> list:
    """The chat messages of one row's prompt; raises Reject naming the key."""
    if not isinstance(obj, dict):
        raise Reject("bad_json", f"a row must be a JSON object, got a {json_type(obj)}")
    key = next((k for k in PROMPT_KEYS if k in obj), None)
    if key is None:
        raise Reject("unknown_format", "none of the keys " + ", ".join(f"'{k}'" for k in PROMPT_KEYS)
                     + "; keys: " + ", ".join(sorted(obj)[:8]))
    msgs = []
    if key != "messages" and "system" in obj:
        msgs.append({"role": "system", "content": _string(obj, "system")})
    if key == "messages":
        m = obj["messages"]
        if not isinstance(m, list) or not m:
            raise Reject("bad_field", "'messages' must be a non-empty list")
        for i, t in enumerate(m):
            where = f"messages[{i}]"
            if not isinstance(t, dict) or t.get("role") not in CHAT_ROLES:
                raise Reject("bad_field", f"{where} must be an object with a role of " + ", ".join(CHAT_ROLES))
            if t.get("content") is None:
                raise Reject("bad_field", f"{where}: no 'content'")
            msgs.append({"role": t["role"], "content": _text_of(t["content"], where)})
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
        if not any(t["role"] == "user" for t in msgs):
            raise Reject("bad_field", "'messages' has no user turn before its last answer")
    elif key == "turns":
        t = obj["turns"]
        if not isinstance(t, list) or not t or not isinstance(t[0], str) or not t[0].strip():
            raise Reject("bad_field", f"'turns' must be a list whose first item is a non-empty string, got "
                         f"{short(t, 60)}")
        msgs.append({"role": "user", "content": t[0]})
    else:
        msgs.append({"role": "user", "content": _string(obj, key)})
    return msgs


def encode_prompt(tok, obj, template_kwargs: dict) -> np.ndarray:
    msgs = prompt_messages(obj)
    try:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except Exception as e:  # the template's raise_exception and jinja errors
        raise Reject("template_error", f"the chat template refused the prompt: {e}") from None
    return np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.int32)


def run(args) -> int:
    template_kwargs = json_object_arg(args.template_kwargs, "--template-kwargs")
    require_input_files(args.inputs)
    check_output_path(args.out, "--out", args.inputs)
    target = check.read_target(args.target) if args.target else None   # first: its errors need no tokenizer
    tok = load_tokenizer(args.tokenizer)
    if tok.chat_template is None:
        raise SystemExit(f"error: the tokenizer in {args.tokenizer} has no chat template (tokenizer_config.json "
                         "'chat_template' or chat_template.jinja); prompts need the target's template")
    vocab = None
    if args.target:
        vocab = target.vocab
        errors = check.check_tokenizer(tok, args.tokenizer, target)
        if errors:
            raise SystemExit("error: " + "\nerror: ".join(errors))
    errors, lengths = [], []
    with atomic_output(args.out) as partial:
        writer = DatasetWriter(partial, args.out)
        try:
            for path in args.inputs:
                for n, line in read_lines(path):
                    try:
                        if isinstance(line, Reject):
                            raise line
                        ids = encode_prompt(tok, load_row_json(line), template_kwargs)
                        if args.max_len and len(ids) > args.max_len:
                            raise Reject("too_long", f"{len(ids)} tokens > --max-len {args.max_len}")
                        if vocab is not None and len(ids) and int(ids.max()) >= vocab:
                            raise Reject("token_beyond_vocab", f"token id {int(ids.max())} >= the target's "
                                         f"vocab_size {vocab}")
                    except Reject as r:
                        errors.append(f"{path}:{n}: {r}")
                        continue
                    writer.add(ids, np.zeros(len(ids), np.uint8))
                    lengths.append(len(ids))
        finally:
            writer.close()
        for e in errors[:MAX_PRINTED_ERRORS]:
            print(f"  {e}", file=sys.stderr)
        if len(errors) > MAX_PRINTED_ERRORS:
            print(f"  ... and {len(errors) - MAX_PRINTED_ERRORS} more", file=sys.stderr)
        if errors:
            raise SystemExit(f"error: {len(errors)} bad rows, nothing written")
        if not lengths:
            raise SystemExit("error: no prompt in " + ", ".join(args.inputs))
    print(f"wrote {args.out}: {len(lengths)} prompts, {sum(lengths)} tokens, length {min(lengths)}-{max(lengths)} "
          f"(loss_mask 0 everywhere: dflash_eval --prompts {args.out})")
    return 0
