#!/usr/bin/env bash
# CLI tests of dflash_data import-jsonl and inspect. Usage: dflash_data_cli.sh DFLASH_DATA WORKDIR CASE
# Each case writes its own input, runs the program and checks the exit code and the message (a bad input must
# exit non-zero and say what is wrong and where; a crash or a silent failure fails the test).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh"
bin="$1" work="$2/$3" case="$3"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1

good_jsonl() {
  printf '%s\n' '{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}' '' \
    '{"input_ids": [5, 6]}' '{"input_ids": [7, 8, 9], "loss_mask": [1, 0, 1]}' > in.jsonl
}

case "$case" in
  good)
    good_jsonl
    expect 0 "wrote out.h5: 3 sequences, 9 tokens, 66.7% trained" "$bin" import-jsonl in.jsonl out.h5 --vocab 10
    [[ -f out.h5 && ! -e out.h5.partial ]] || { echo "FAIL: out.h5 missing or partial file left"; exit 1; }
    expect 0 "sequences +3" "$bin" inspect out.h5 --vocab 10
    expect 0 "tokens +9" "$bin" inspect out.h5
    expect 0 "length +min 2  mean 3.00  max 4" "$bin" inspect out.h5
    expect 0 "trained +66.67% of tokens have loss_mask = 1 \(6 of 9\)" "$bin" inspect out.h5
    expect 0 "max token id +9 \(vocab 10\)" "$bin" inspect out.h5 --vocab 10
    expect 0 "loss_mask \[1, 0, 1\]" "$bin" inspect out.h5 --seq 2
    ;;
  bad_json)
    printf '%s\n' '{"input_ids": [1, 2]}' '{"input_ids": [1, 2, x]}' > in.jsonl
    expect nonzero "in.jsonl:2: not valid JSON" "$bin" import-jsonl in.jsonl out.h5
    [[ ! -e out.h5 && ! -e out.h5.partial ]] || { echo "FAIL: a failed import left a file"; exit 1; }
    ;;
  missing_ids)
    printf '%s\n' '{"input_ids": [1]}' '{"tokens": [1, 2]}' > in.jsonl
    expect nonzero 'in.jsonl:2: missing "input_ids"' "$bin" import-jsonl in.jsonl out.h5
    ;;
  bad_mask)
    printf '%s\n' '{"input_ids": [1, 2], "loss_mask": [1]}' > in.jsonl
    expect nonzero 'in.jsonl:1: "loss_mask" has 1 values but "input_ids" has 2' "$bin" import-jsonl in.jsonl out.h5
    printf '%s\n' '{"input_ids": [1, 2], "loss_mask": [1, 2]}' > in2.jsonl
    expect nonzero 'in2.jsonl:1: "loss_mask"\[1\] is 2, expected 0 or 1' "$bin" import-jsonl in2.jsonl out.h5
    ;;
  bad_token)
    printf '%s\n' '{"input_ids": [1, 2]}' '{"input_ids": [3, -4]}' > in.jsonl
    expect nonzero 'in.jsonl:2: "input_ids"\[1\] is -4' "$bin" import-jsonl in.jsonl out.h5
    printf '%s\n' '{"input_ids": [1, 2]}' '{"input_ids": [3, 4, 10]}' > in2.jsonl
    expect nonzero 'in2.jsonl:2: "input_ids"\[2\] is 10 >= --vocab 10' "$bin" import-jsonl in2.jsonl out.h5 --vocab 10
    ;;
  inspect_bad)
    good_jsonl
    expect 0 "wrote" "$bin" import-jsonl in.jsonl out.h5
    expect nonzero "out.h5: dataset 'tokens': sequence 2 \(token 2 of 3\) has id 9 >= vocab 9" \
      "$bin" inspect out.h5 --vocab 9
    expect nonzero "nope.h5: no such file" "$bin" inspect nope.h5
    echo "not hdf5" > text.h5
    expect nonzero "text.h5: not an HDF5 file" "$bin" inspect text.h5
    expect nonzero "unknown option --vocabulary" "$bin" inspect out.h5 --vocabulary 9
    expect 2 "unknown subcommand 'convert'" "$bin" convert
    ;;
  *)
    echo "unknown case $case"; exit 1 ;;
esac
echo "PASS $case"
