"""python -m dflash_prep {tokenize,prompts,regenerate,check} ...  (data/README.md, "Preparing chat data")."""
import argparse
import os
import sys


def check_run(args) -> int:
    from . import check
    from .render import load_tokenizer
    tok = load_tokenizer(args.tokenizer)
    target = check.read_target(args.target)
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
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")   # no "PyTorch was not found" advisory
    from . import prompts_cmd, regenerate, tokenize_cmd
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
    c.add_argument("--mask-token-id", type=int, help="the drafter's mask_token_id")
    c.add_argument("--data", nargs="*", default=[], help="HDF5 training files to scan")
    args = p.parse_args(argv)
    if args.command == "tokenize":
        return tokenize_cmd.run(args)
    if args.command == "prompts":
        return prompts_cmd.run(args)
    if args.command == "regenerate":
        return regenerate.run(args)
    return check_run(args)


if __name__ == "__main__":
    sys.exit(main())
