#!/usr/bin/env bash
# On the emulated GPU: runs a test program under two thread orders (DFLASH_EMU_ORDERS, default "forward reverse":
# the order of the threads of a block between barriers, of the blocks of a grid, and of ready stream work), each
# run must pass, and every copy into host memory must be bit-identical between them (DFLASH_EMU_DIGEST logs a
# hash of each): a kernel whose result depends on an order the GPU does not guarantee (a race, a missing barrier,
# a missing stream or event wait) fails here, naming the first copy that differs.
# Usage: run_orders.sh PROGRAM [ARGS...]; exit 77 (skipped) passes through from the program.
set -u
orders=(${DFLASH_EMU_ORDERS:-forward reverse})
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for order in "${orders[@]}"; do
  DFLASH_EMU_ORDER=$order DFLASH_EMU_DIGEST="$dir/$order" "$@"
  rc=$?
  if ((rc == 77)); then exit 77; fi
  if ((rc != 0)); then
    echo "run_orders: FAILED under DFLASH_EMU_ORDER=$order (exit $rc): $*"
    exit 1
  fi
done
first=${orders[0]}
for order in "${orders[@]:1}"; do
  if ! cmp -s "$dir/$first" "$dir/$order"; then
    line=$(cmp "$dir/$first" "$dir/$order" 2>&1 | sed -n 's/.* line \([0-9]*\).*/\1/p')
    echo "run_orders: ORDER-DEPENDENT RESULT: copy ${line:-?} to the host differs between DFLASH_EMU_ORDER=$first" \
         "($(sed -n "${line:-1}p" "$dir/$first")) and $order ($(sed -n "${line:-1}p" "$dir/$order")): $*"
    exit 1
  fi
done
echo "run_orders: bit-identical under ${orders[*]}: $(wc -l < "$dir/$first") copies to the host"
