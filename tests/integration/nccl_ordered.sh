#!/usr/bin/env bash
# The stream-ordered TP all-reduce (nccl_check --ordered, tests/integration/nccl_check.cpp) under each emulator
# thread order (DFLASH_EMU_ORDERS, default "forward reverse": the order of ready stream work among others; a real
# GPU ignores it): every run must pass (stream-ordered and host-synchronised forwards bit-identical), and the
# outputs' hashes must be the same under every order (a missing event wait reads stale data under one of them).
# Usage: nccl_ordered.sh MPIRUN NP NCCL_CHECK DIR; exit 77 (skipped) passes through from the program.
set -u
mpirun=$1 np=$2 prog=$3 dir=$4
mkdir -p "$dir"
orders=(${DFLASH_EMU_ORDERS:-forward reverse})
for order in "${orders[@]}"; do
  rm -f "$dir/hash_$order"
  DFLASH_EMU_ORDER=$order "$mpirun" -np "$np" "$prog" --ordered "$dir/targets" "$dir/hash_$order"
  rc=$?
  if ((rc == 77)); then exit 77; fi
  if ((rc != 0)); then
    echo "nccl_ordered: FAILED under DFLASH_EMU_ORDER=$order (exit $rc)"
    exit 1
  fi
done
first=${orders[0]}
for order in "${orders[@]:1}"; do
  if ! cmp -s "$dir/hash_$first" "$dir/hash_$order"; then
    echo "nccl_ordered: ORDER-DEPENDENT RESULT between DFLASH_EMU_ORDER=$first and $order:"
    diff "$dir/hash_$first" "$dir/hash_$order"
    exit 1
  fi
done
echo "nccl_ordered: outputs bit-identical under ${orders[*]} ($(wc -l < "$dir/hash_$first") outputs hashed)"
