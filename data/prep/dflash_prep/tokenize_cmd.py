"""dflash_prep tokenize: chat jsonl files -> one HDF5 training file, with statistics and rejects.

Truncation policy (--max-len N, N >= 1; no limit without it): 'head' (default) keeps the first N tokens (the
prompt, then as much of the answers as fits; the cut answer loses its end-of-turn token); a row whose kept part has
no two adjacent trained tokens (no anchor with a label) is rejected as prompt_too_long. 'reject' rejects every row
longer than N.
Rejected rows are never dropped silently: --on-reject fail (default) reports them all with file:line and writes
nothing; --on-reject skip writes them to the rejects file and continues.
"""
from collections import Counter
from dataclasses import dataclass, field
import json
import os
import sys
from typing import Optional

import numpy as np

from . import check
from .atomic import atomic_output, check_output_path, write_text_atomic
from .h5out import DatasetWriter
from .options import non_negative_int, positive_int
from .render import ChatEncoder, load_tokenizer
from .rows import Reject, json_object_arg, parse_row, read_lines, require_input_files

MAX_PRINTED_REJECTS = 20


@dataclass
class FileStats:
    path: str
    rows: int = 0
    sequences: int = 0
    tokens: int = 0
    trained: int = 0
    truncated: int = 0
    min_len: Optional[int] = None
    max_len: int = 0
    reasoning_dropped_by_template: int = 0
    rejects: Counter = field(default_factory=Counter)
    eot: Counter = field(default_factory=Counter)

    def add(self, n: int, trained: int):
        self.sequences += 1
        self.tokens += n
        self.trained += trained
        self.min_len = n if self.min_len is None else min(self.min_len, n)
        self.max_len = max(self.max_len, n)

    def as_dict(self) -> dict:
        return {"file": self.path, "rows": self.rows, "sequences": self.sequences, "tokens": self.tokens,
                "trained_tokens": self.trained, "trained_share": round(self.trained / max(self.tokens, 1), 4),
                "min_len": self.min_len or 0, "mean_len": round(self.tokens / max(self.sequences, 1), 1),
                "max_len": self.max_len, "truncated": self.truncated,
                "reasoning_dropped_by_template": self.reasoning_dropped_by_template,
                "rejected": sum(self.rejects.values()), "rejects": dict(self.rejects), "end_of_turn": dict(self.eot)}

    def line(self) -> str:
        d = self.as_dict()
        rej = ", ".join(f"{k} {v}" for k, v in sorted(self.rejects.items())) or "none"
        return (f"{self.path}: {d['rows']} rows -> {d['sequences']} sequences, {d['tokens']} tokens "
                f"({100 * d['trained_share']:.1f}% trained), length {d['min_len']}-{d['max_len']} "
                f"(mean {d['mean_len']}), {d['truncated']} truncated, rejected {d['rejected']} ({rej})")


def add_arguments(p):
    p.add_argument("inputs", nargs="+", help="jsonl files (OpenAI 'messages', ShareGPT 'conversations', 'text')")
    p.add_argument("--tokenizer", required=True, help="the target's model directory (tokenizer.json, "
                   "tokenizer_config.json with its chat template)")
    p.add_argument("--out", required=True, help="output HDF5 file (written as OUT.partial, then renamed)")
    p.add_argument("--think", choices=("keep", "drop"), default="keep",
                   help="assistant reasoning (<think>...</think> or reasoning_content): keep it (trained) or drop it")
    p.add_argument("--template-kwargs", default="{}", help="JSON object passed to the chat template, e.g. "
                   "'{\"enable_thinking\": false}'")
    p.add_argument("--max-len", type=positive_int, help="longest sequence in tokens (default: no limit)")
    p.add_argument("--truncate", choices=("head", "reject"), default="head",
                   help="rows longer than --max-len: keep the first N tokens (head) or reject them")
    p.add_argument("--on-reject", choices=("fail", "skip"), default="fail",
                   help="fail: report every bad row and write nothing; skip: write them to --rejects and go on")
    p.add_argument("--rejects", help="rejects file for --on-reject skip (default: OUT without .h5 + .rejects.jsonl)")
    p.add_argument("--stats", help="write the statistics as JSON here (default: OUT without .h5 + .stats.json)")
    p.add_argument("--target", help="the target's model directory (config.json): checks the tokenizer against it "
                   "and every token id against its vocab_size")
    p.add_argument("--mask-token-id", type=non_negative_int, help="the drafter's mask_token_id: rows containing it "
                   "are rejected")
    p.add_argument("--workers", type=positive_int, default=1, help="processes rendering and tokenizing rows (the "
                   "output is the same for any number)")


def _stem(path: str) -> str:
    return path[:-3] if path.endswith(".h5") else path


@dataclass
class LineResult:
    """One input line's outcome: a sequence, or a reject (reason, message). Picklable for the worker pool."""
    line: int
    text: Optional[str]                 # the line as read (for the rejects file); None when not UTF-8
    tokens: Optional[np.ndarray] = None
    mask: Optional[np.ndarray] = None
    truncated: bool = False
    reasoning_dropped: int = 0
    eot: list = field(default_factory=list)
    reject: Optional[tuple] = None      # (reason, message)


def encode_row(enc: ChatEncoder, row, args, vocab: Optional[int], out: LineResult):
    """Fills out with the row's tokens and mask after truncation and the vocabulary checks; raises Reject."""
    e = enc.encode(row)
    tokens, mask = e.tokens, e.loss_mask
    if args.max_len and len(tokens) > args.max_len:
        if args.truncate == "reject":
            raise Reject("too_long", f"{len(tokens)} tokens > --max-len {args.max_len}")
        tokens, mask = tokens[:args.max_len], mask[:args.max_len]
        if not np.any(mask[:-1] & mask[1:]):
            raise Reject("prompt_too_long", f"the first {args.max_len} tokens (--max-len) hold no two adjacent "
                         f"trained tokens ({len(e.tokens)} tokens in all)")
        out.truncated = True
    elif len(tokens) < 2 or not np.any(mask[:-1] & mask[1:]):
        raise Reject("nothing_trained", "fewer than two adjacent trained tokens")
    if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
        raise Reject("token_beyond_vocab", f"token id {int(tokens.max())} >= the target's vocab_size {vocab}")
    if args.mask_token_id is not None and np.any(tokens == args.mask_token_id):
        raise Reject("mask_token_in_data", f"contains the mask token id {args.mask_token_id} at position "
                     f"{int(np.argmax(tokens == args.mask_token_id))}")
    out.tokens, out.mask = tokens, mask
    out.reasoning_dropped, out.eot = e.reasoning_dropped, e.eot


def encode_line(enc: ChatEncoder, args, vocab: Optional[int], line_no: int, line) -> LineResult:
    out = LineResult(line_no, line if isinstance(line, str) else None)
    try:
        if isinstance(line, Reject):
            raise line
        encode_row(enc, parse_row(line_no, line), args, vocab, out)
    except Reject as r:
        out.reject = (r.reason, str(r))
    return out


# ---- worker pool (--workers N): each worker process loads the tokenizer once; results come back in input order
_worker = {}


def _worker_init(args, vocab, template_kwargs):
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _worker.update(enc=ChatEncoder(load_tokenizer(args.tokenizer), args.think, template_kwargs), args=args,
                   vocab=vocab)


def _worker_encode(chunk):
    return [encode_line(_worker["enc"], _worker["args"], _worker["vocab"], n, line) for n, line in chunk]


def _chunks(lines, size):
    chunk = []
    for item in lines:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def encoded_rows(path, enc, args, vocab, template_kwargs, pool):
    """The LineResult of every non-blank line of path, in order."""
    if pool is None:
        for n, line in read_lines(path):
            yield encode_line(enc, args, vocab, n, line)
        return
    for results in pool.imap(_worker_encode, _chunks(read_lines(path), 64)):
        yield from results


def run(args) -> int:
    template_kwargs = json_object_arg(args.template_kwargs, "--template-kwargs")
    require_input_files(args.inputs)
    stem = _stem(args.out)
    rejects_path = args.rejects or stem + ".rejects.jsonl"
    stats_path = args.stats or stem + ".stats.json"
    for path, option in ((args.out, "--out"), (rejects_path, "--rejects"), (stats_path, "--stats")):
        check_output_path(path, option, args.inputs)
    target = check.read_target(args.target) if args.target else None   # first: its errors need no tokenizer
    tok = load_tokenizer(args.tokenizer)
    vocab = None
    if args.target:
        vocab = target.vocab
        errors = check.check_tokenizer(tok, args.tokenizer, target)
        if args.mask_token_id is not None:
            errors += check.check_mask_token(tok, args.mask_token_id, target)[0]
        if errors:
            raise SystemExit("error: " + "\nerror: ".join(errors))
    enc = ChatEncoder(tok, args.think, template_kwargs)
    all_stats, rejects = [], []

    pool = None
    if args.workers > 1:
        import multiprocessing
        # spawn: a forked copy of a process that has used the tokenizers library's threads can deadlock
        pool = multiprocessing.get_context("spawn").Pool(args.workers, _worker_init, (args, vocab, template_kwargs))
    with atomic_output(args.out) as partial:
        writer = DatasetWriter(partial, args.out)
        try:
            for path in args.inputs:
                st = FileStats(path)
                all_stats.append(st)
                for e in encoded_rows(path, enc, args, vocab, template_kwargs, pool):
                    st.rows += 1
                    if e.reject:
                        st.rejects[e.reject[0]] += 1
                        rejects.append({"file": path, "line": e.line, "reason": e.reject[0], "message": e.reject[1],
                                        "row": e.text})
                        continue
                    writer.add(e.tokens, e.mask)
                    st.add(len(e.tokens), int(e.mask.sum()))
                    st.truncated += e.truncated
                    st.reasoning_dropped_by_template += e.reasoning_dropped
                    st.eot.update(e.eot)
                print(st.line(), flush=True)
        finally:
            if pool is not None:
                pool.terminate()
            writer.close()   # raises OutputError when a write failed (the partial file is then removed)
        total = _total(all_stats)
        if len(all_stats) > 1:
            print(total.line())
        for r in rejects[:MAX_PRINTED_REJECTS]:
            print(f"  rejected {r['file']}:{r['line']}: {r['reason']}: {r['message']}", file=sys.stderr)
        if len(rejects) > MAX_PRINTED_REJECTS:
            print(f"  ... and {len(rejects) - MAX_PRINTED_REJECTS} more", file=sys.stderr)
        if rejects and args.on_reject == "fail":
            raise SystemExit(f"error: {len(rejects)} rows rejected, nothing written; fix them, or pass "
                             f"--on-reject skip to write them to {rejects_path} and go on")
        if total.sequences == 0:
            raise SystemExit("error: no sequence left to write")

    if rejects:
        write_text_atomic(rejects_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects))
        print(f"{len(rejects)} rejected rows written to {rejects_path}")
    report = {"out": args.out, "tokenizer": args.tokenizer, "think": args.think, "max_len": args.max_len,
              "truncate": args.truncate, "total": total.as_dict(), "files": [s.as_dict() for s in all_stats]}
    write_text_atomic(stats_path, json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}: {total.sequences} sequences, {total.tokens} tokens, {total.trained} trained "
          f"({100 * total.trained / max(total.tokens, 1):.1f}%); statistics in {stats_path}")
    return 0


def _total(stats: list) -> FileStats:
    t = FileStats("total")
    for s in stats:
        t.rows += s.rows
        t.sequences += s.sequences
        t.tokens += s.tokens
        t.trained += s.trained
        t.truncated += s.truncated
        t.reasoning_dropped_by_template += s.reasoning_dropped_by_template
        t.max_len = max(t.max_len, s.max_len)
        if s.min_len is not None:
            t.min_len = s.min_len if t.min_len is None else min(t.min_len, s.min_len)
        t.rejects.update(s.rejects)
        t.eot.update(s.eot)
    return t
