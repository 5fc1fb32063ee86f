# The emulated NCCL over MPI (tests/emu/nccl_emu_check.cpp, one case per run; kernels/cuda/emu/nccl.cpp). Every
# rank has its own emulated device (DFLASH_EMU_DEVICES = ranks) except in duplicate_device; hangs are reported
# after DFLASH_EMU_NCCL_TIMEOUT_S (20 s here: a regression fails with the emulation's message, not ctest's kill).
# The planted defects (unmatched_send, send_send, duplicate_device) must print the emulation's message (matched
# below) and exit 1; any failed check of the program prints "FAILED", which fails every entry.
# lib/comm/mpi_init.cpp alone (no dflash library): the one MPI start-up and error handling of every program
add_executable(nccl_emu_check ${CMAKE_CURRENT_LIST_DIR}/nccl_emu_check.cpp ${CMAKE_SOURCE_DIR}/lib/comm/mpi_init.cpp)
target_include_directories(nccl_emu_check PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(nccl_emu_check PRIVATE dflash_emu MPI::MPI_C)
target_compile_definitions(nccl_emu_check PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
if(NOT DFLASH_MPIRUN)  # set in tests/integration's scope, not visible here
  set(DFLASH_MPIRUN ${CMAKE_SOURCE_DIR}/tests/integration/mpirun.sh)
endif()

# dflash_nccl_emu_test(<case> <np> [NAME name] [ENV var=value...] [PASS regex pieces...] [TIMEOUT_S seconds]
#                      [DEVICES n]): the PASS pieces are joined into one regular expression
function(dflash_nccl_emu_test case np)
  cmake_parse_arguments(T "" "NAME;TIMEOUT_S;DEVICES" "ENV;PASS" ${ARGN})
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "dflash_nccl_emu_test(${case}): unexpected arguments ${T_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT T_NAME)
    set(T_NAME nccl_emu_${case}_np${np})
  endif()
  if(NOT T_TIMEOUT_S)
    set(T_TIMEOUT_S 20)
  endif()
  if(NOT T_DEVICES)
    set(T_DEVICES ${np})
  endif()
  add_test(NAME ${T_NAME} COMMAND ${DFLASH_MPIRUN} -np ${np} $<TARGET_FILE:nccl_emu_check> ${case})
  set_tests_properties(${T_NAME} PROPERTIES LABELS "cuda;nccl;emu" TIMEOUT 90 FAIL_REGULAR_EXPRESSION "FAILED"
                       ENVIRONMENT "DFLASH_EMU_DEVICES=${T_DEVICES};DFLASH_EMU_NCCL_TIMEOUT_S=${T_TIMEOUT_S};${T_ENV}")
  if(T_PASS)
    string(JOIN "" pass ${T_PASS})
    set_tests_properties(${T_NAME} PROPERTIES PASS_REGULAR_EXPRESSION "${pass}")
  endif()
endfunction()

foreach(case sendrecv ring allreduce broadcast order two_comms bad_args)
  dflash_nccl_emu_test(${case} 2)
  dflash_nccl_emu_test(${case} 3)
endforeach()
# bf16 sums as NCCL's ring rounds them; at 5 ranks (TP 5) it prints the error of the target's bf16 all-reduce
foreach(np 1 2 3 5)
  dflash_nccl_emu_test(bf16_sum ${np} PASS "bf16_sum on ${np} rank\\(s\\): ok")
endforeach()
dflash_nccl_emu_test(abort_recv 2)
dflash_nccl_emu_test(abort_init 2)
# the worker picks ready streams in reverse and runs queued work only once the host waits for it
foreach(case order ring sendrecv)
  dflash_nccl_emu_test(${case} 3 NAME nccl_emu_${case}_reverse_lag_np3 ENV "DFLASH_EMU_ORDER=reverse"
                       "DFLASH_EMU_LAG_MS=60000")
endforeach()
dflash_nccl_emu_test(thread_single 1)
set_tests_properties(nccl_emu_thread_single_np1 PROPERTIES SKIP_RETURN_CODE 77)

# planted defects
dflash_nccl_emu_test(unmatched_send 2 TIMEOUT_S 3 PASS
  "emulated NCCL: \\[rank 0\\] ncclSend\\(256 bytes to rank 1\\) on communicator 0:0 \\(rank 0 of 2, device 0\\), "
  "stream 0x[0-9a-f]+, has waited 3 s for rank 1 to post the matching ncclRecv: a pattern that deadlocks under NCCL")
dflash_nccl_emu_test(send_send 2 TIMEOUT_S 3 PASS
  "emulated NCCL: \\[rank 1\\] ncclSend\\(256 bytes to rank 0\\) on communicator 0:0 \\(rank 1 of 2, device 1\\), "
  "stream 0x[0-9a-f]+, has waited 3 s for rank 0 to post the matching ncclRecv: a pattern that deadlocks under NCCL")
dflash_nccl_emu_test(duplicate_device 2 DEVICES 1 PASS
  "emulated NCCL: \\[rank [01]\\] ncclCommInitRankConfig\\(0:0\\): "
  "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 0")
