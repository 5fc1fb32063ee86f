# The emulated cuBLASLt's own tests (kernels/cuda/emu/cublaslt.cpp), included by tests/emu/CMakeLists.txt in
# -DDFLASH_CUDA=EMULATE builds. One ctest entry runs the whole binary; its fault cases re-run the binary itself as
# child processes (a device fault is sticky for the process that has it).
add_executable(emu_cublaslt_tests ${CMAKE_CURRENT_LIST_DIR}/test_emu_cublaslt.cpp)
target_link_libraries(emu_cublaslt_tests PRIVATE dflash_emu doctest::doctest)
target_include_directories(emu_cublaslt_tests PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_options(emu_cublaslt_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
add_test(NAME emu_cublaslt COMMAND emu_cublaslt_tests)
set_tests_properties(emu_cublaslt PROPERTIES LABELS "cuda;emu" TIMEOUT 120)
