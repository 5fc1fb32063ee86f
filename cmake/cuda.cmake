# Detects the CUDA toolkit (nvcc, cuBLASLt, NCCL) for DFLASH_CUDA=AUTO|ON|OFF and sets DFLASH_WITH_CUDA.
# The CUDA backend compiles and links wherever the toolkit is installed; it runs only where a GPU is.
set(DFLASH_WITH_CUDA OFF)
if(NOT DFLASH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  find_library(DFLASH_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  find_path(DFLASH_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublasLt
     AND DFLASH_NCCL_LIBRARY AND DFLASH_NCCL_INCLUDE_DIR)
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
      set(CMAKE_CUDA_ARCHITECTURES 90)   # Hopper (H100/H200); override with -DCMAKE_CUDA_ARCHITECTURES
    endif()
    set(DFLASH_WITH_CUDA ON)
    message(STATUS "dflash: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, NCCL ${DFLASH_NCCL_LIBRARY})")
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
