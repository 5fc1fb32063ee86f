# Detects the CUDA toolkit (nvcc, cuBLASLt, NCCL) for DFLASH_CUDA=AUTO|ON|OFF and sets DFLASH_WITH_CUDA.
# The CUDA backend compiles and links wherever the toolkit is installed; it runs only where a GPU is.
# Architectures: sm_90 (H100/H200), sm_100 (B200), sm_120 (RTX PRO 6000 Blackwell) by default; override with
# -DCMAKE_CUDA_ARCHITECTURES=90 (or the CUDAARCHS environment variable), e.g. to build faster for one GPU.
set(DFLASH_WITH_CUDA OFF)
set(DFLASH_CUDA_EMULATED OFF)
if(DFLASH_CUDA STREQUAL "EMULATE")
  # The emulated GPU (kernels/cuda/emu/README.md): the toolkit's headers only; nvcc, libcudart, libcublasLt and
  # libnccl are not used. The .cu files compile as C++ with kernels/cuda/emu/device.h force-included.
  find_path(DFLASH_CUDA_INCLUDE_DIR cuda_runtime.h HINTS ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} /usr/local/cuda
            PATH_SUFFIXES include)
  find_path(DFLASH_NCCL_INCLUDE_DIR nccl.h HINTS ${DFLASH_NCCL_ROOT} $ENV{DFLASH_NCCL_ROOT} /usr/local/cuda
            PATH_SUFFIXES include)
  find_path(DFLASH_CUBLASLT_INCLUDE_DIR cublasLt.h HINTS ${DFLASH_CUDA_INCLUDE_DIR} /usr/local/cuda PATH_SUFFIXES include)
  find_package(Boost 1.74 CONFIG COMPONENTS context)
  if(NOT DFLASH_CUDA_INCLUDE_DIR OR NOT DFLASH_NCCL_INCLUDE_DIR OR NOT DFLASH_CUBLASLT_INCLUDE_DIR OR NOT Boost_FOUND)
    message(FATAL_ERROR "DFLASH_CUDA=EMULATE needs the CUDA toolkit's headers (cuda_runtime.h: "
                        "'${DFLASH_CUDA_INCLUDE_DIR}', cublasLt.h: '${DFLASH_CUBLASLT_INCLUDE_DIR}', nccl.h: "
                        "'${DFLASH_NCCL_INCLUDE_DIR}') and Boost.Context (found: ${Boost_FOUND}; Debian: "
                        "libboost-context-dev, installed by mpi_launch/install_deps.sh)")
  endif()
  set(DFLASH_WITH_CUDA ON)
  set(DFLASH_CUDA_EMULATED ON)
  message(STATUS "dflash: CUDA backend EMULATED on the CPU (headers ${DFLASH_CUDA_INCLUDE_DIR}, no GPU used)")
elseif(NOT DFLASH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  # NCCL: with the toolkit, or where DFLASH_NCCL_ROOT (variable or environment) says: e.g. the nvidia-nccl wheel's
  # folder (site-packages/nvidia/nccl: nccl.h in its include folder, libnccl.so.2 without the unversioned link in its
  # lib folder)
  set(_nccl_roots ${DFLASH_NCCL_ROOT} $ENV{DFLASH_NCCL_ROOT})
  find_library(DFLASH_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${_nccl_roots} ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 PATH_SUFFIXES lib lib64)
  find_path(DFLASH_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_roots} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
            PATH_SUFFIXES include)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublasLt
     AND DFLASH_NCCL_LIBRARY AND DFLASH_NCCL_INCLUDE_DIR)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      set(CMAKE_CUDA_ARCHITECTURES "90;100;120" CACHE STRING "CUDA architectures to build for")
    endif()
    enable_language(CUDA)
    # A build folder configured before this default existed cached the toolkit's own default (52 or 75, too old
    # for bf16 tensor cores); nobody picks those for this project on purpose, so they are replaced.
    if(CMAKE_CUDA_ARCHITECTURES STREQUAL "52" OR CMAKE_CUDA_ARCHITECTURES STREQUAL "75")
      set(CMAKE_CUDA_ARCHITECTURES "90;100;120" CACHE STRING "CUDA architectures to build for" FORCE)
    endif()
    set(CMAKE_CUDA_STANDARD 17)   # CMake 3.25 has no C++20 flags for nvcc; device code needs only 17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(DFLASH_WITH_CUDA ON)
    message(STATUS "dflash: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                   "${CMAKE_CUDA_ARCHITECTURES}, NCCL ${DFLASH_NCCL_LIBRARY})")
  elseif(DFLASH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DFLASH_CUDA=ON but the CUDA toolkit is incomplete: nvcc='${CMAKE_CUDA_COMPILER}', "
                        "cuBLASLt found=${CUDAToolkit_FOUND}, NCCL='${DFLASH_NCCL_LIBRARY}'. "
                        "Install the CUDA toolkit and NCCL, or configure with -DDFLASH_CUDA=OFF.")
  else()
    message(STATUS "dflash: CUDA backend OFF (no complete CUDA toolkit found; DFLASH_CUDA=AUTO)")
  endif()
else()
  message(STATUS "dflash: CUDA backend OFF (DFLASH_CUDA=OFF)")
endif()
