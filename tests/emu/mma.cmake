# The warp matrix instructions (kernels/cuda/mma.cuh) on the emulated GPU, included by tests/emu/CMakeLists.txt in
# DFLASH_CUDA=EMULATE builds: emu_mma (hand-computed tiles, planted misuses as child processes) and, where nvcc is
# installed, emu_mma_ptxas (the inline PTX assembled for sm_90, no GPU needed).
add_executable(emu_mma_tests ${CMAKE_CURRENT_SOURCE_DIR}/test_emu_mma.cpp ${CMAKE_CURRENT_SOURCE_DIR}/mma_kernels.cu)
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/mma_kernels.cu PROPERTIES LANGUAGE CXX
                            COMPILE_OPTIONS "-x;c++;-Wno-unknown-pragmas;-include;${CMAKE_SOURCE_DIR}/kernels/cuda/emu/device.h")
# Only the emulated GPU: the test brings kernel_launch.cuh's cuda_fail itself (test_emu_mma.cpp).
target_link_libraries(emu_mma_tests PRIVATE dflash_emu doctest::doctest)
target_compile_options(emu_mma_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
add_test(NAME emu_mma COMMAND emu_mma_tests)
set_tests_properties(emu_mma PROPERTIES LABELS "cuda;emu" TIMEOUT 300)
# The same under another thread order: the collectives must not depend on which lane arrives last.
add_test(NAME emu_mma_shuffled COMMAND emu_mma_tests)
set_tests_properties(emu_mma_shuffled PROPERTIES LABELS "cuda;emu" TIMEOUT 300 ENVIRONMENT "DFLASH_EMU_ORDER=shuffle:7")

# cp.async landing at the issue (DFLASH_EMU_CP_ASYNC=issue), the earliest a GPU may land it
add_test(NAME emu_mma_cp_async_at_issue COMMAND emu_mma_tests "--test-case=emu cp.async:*")
set_tests_properties(emu_mma_cp_async_at_issue PROPERTIES LABELS "cuda;emu" TIMEOUT 120 ENVIRONMENT "DFLASH_EMU_CP_ASYNC=issue")

find_program(NVCC nvcc PATHS /usr/local/cuda/bin)
if(NVCC)
  add_test(NAME emu_mma_ptxas
           COMMAND ${NVCC} -arch=sm_90 -std=c++17 -I${CMAKE_SOURCE_DIR} -c
                   ${CMAKE_CURRENT_SOURCE_DIR}/mma_nvcc_check.cu -o ${CMAKE_CURRENT_BINARY_DIR}/mma_nvcc_check.o)
  set_tests_properties(emu_mma_ptxas PROPERTIES LABELS "cuda;emu" TIMEOUT 300)
endif()
