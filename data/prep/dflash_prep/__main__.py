"""dflash-prep {tokenize,prompts,regenerate,check,report,serve-check} ...  (data/README.md, "Preparing chat data").
The console script 'dflash-prep' of the installed package, also 'python -m dflash_prep'."""
import argparse
import os
import sys
import traceback


def check_run(args) -> int:
    from . import check
    from .render import load_tokenizer
    target = check.read_target(args.target)   # first: its errors need no slow tokenizer load
    tok = load_tokenizer(args.tokenizer)
    errors = check.check_tokenizer(tok, args.tokenizer, target)
    notes = [f"tokenizer {args.tokenizer}: {len(tok)} tokens, eos {tok.eos_token!r} ({tok.eos_token_id}); target "
             f"{args.target}: vocab_size {target.vocab}, eos ids {sorted(target.eos_ids)}"]
    if args.mask_token_id is not None:
        e, n = check.check_mask_token(tok, args.mask_token_id, target)
        errors += e
        notes += n
    for path in args.data:
        e, summary = check.scan_data(path, target.vocab, len(tok), args.mask_token_id)
        errors += e
        if summary:
            notes.append(f"{path}: {summary}")
    for n in notes:
        print(n)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        print(f"check: {len(errors)} problems", file=sys.stderr)
        return 1
    print("check: OK")
    return 0


def main(argv=None) -> int:
    """Runs a command. Errors end the run with one message and exit code 1, never a traceback: the commands raise
    SystemExit with their message, OutputError for a file that cannot be written; any other OSError is reported
    with its file; anything else is a bug, reported as one (DFLASH_PREP_TRACEBACK=1 shows the traceback)."""
    from .atomic import OutputError
    try:
        return _run(argv)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: say so in one line instead of a traceback the user cannot act on
        if os.environ.get("DFLASH_PREP_TRACEBACK") == "1":
            traceback.print_exc()
        print(f"error: internal error in dflash-prep ({type(e).__name__}: {e}); please report it with the command "
              "and input (DFLASH_PREP_TRACEBACK=1 shows where it happened)", file=sys.stderr)
    return 1


def _run(argv) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")   # no "PyTorch was not found" advisory
    from . import prompts_cmd, regenerate, report, tokenize_cmd
    from .options import non_negative_int
    p = argparse.ArgumentParser(prog="dflash-prep", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokenize", help="chat jsonl -> HDF5 tokens + assistant-only loss masks")
    tokenize_cmd.add_arguments(t)
    pr = sub.add_parser("prompts", help="prompt jsonl (prompt / question / turns / messages) -> HDF5 prompts for "
                        "dflash_eval: chat template + generation prompt, loss_mask 0")
    prompts_cmd.add_arguments(pr)
    r = sub.add_parser("regenerate", help="replace assistant turns with generations of an OpenAI-compatible server")
    regenerate.add_arguments(r)
    c = sub.add_parser("check", help="tokenizer vs target model (vocab size, special ids), data vs both")
    c.add_argument("--tokenizer", required=True, help="the tokenizer's model directory")
    c.add_argument("--target", required=True, help="the target's model directory (config.json)")
    c.add_argument("--mask-token-id", type=non_negative_int, help="the drafter's mask_token_id")
    c.add_argument("--data", nargs="*", default=[], help="HDF5 training files to scan")
    report.add_parser(sub)   # metrics.jsonl -> TensorBoard / W&B (the [report] extra; docs/reporting.md)
    from . import serve_check
    sc = sub.add_parser("serve-check", help="a serving engine (vLLM offline or server, SGLang server) with your "
                        "exported drafter, next to dflash_eval: lossless, tau, acceptance per position and prompt")
    serve_check.add_arguments(sc)
    args = p.parse_args(argv)
    if args.command == "tokenize":
        return tokenize_cmd.run(args)
    if args.command == "prompts":
        return prompts_cmd.run(args)
    if args.command == "regenerate":
        return regenerate.run(args)
    if args.command == "report":
        return report.run(args)
    if args.command == "serve-check":
        return serve_check.run(args)
    return check_run(args)


if __name__ == "__main__":
    sys.exit(main())
