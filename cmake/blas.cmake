# The CPU BLAS: OpenBLAS built for OpenMP, so that a BLAS call made inside one of our OpenMP parallel regions
# runs on the calling thread instead of starting a second thread pool that fights ours (Debian's default pthread
# build was 4x slower here for the attention tiles). Falls back to pkg-config's `openblas` elsewhere.
# DFLASH_BLAS_DIR (the folder of libopenblas.so) and DFLASH_CBLAS_INCLUDE_DIR point elsewhere than /usr (e.g. the
# packages mpi_launch/device_bundle.sh unpacks).
set(DFLASH_BLAS_DIR /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp CACHE PATH
    "folder of the OpenMP build of OpenBLAS (libopenblas.so)")
find_library(DFLASH_BLAS_LIBRARY NAMES openblas PATHS ${DFLASH_BLAS_DIR} NO_DEFAULT_PATH)
find_path(DFLASH_CBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
          NO_DEFAULT_PATH)
if(DFLASH_BLAS_LIBRARY AND DFLASH_CBLAS_INCLUDE_DIR)
  add_library(dflash_blas INTERFACE)
  target_link_libraries(dflash_blas INTERFACE ${DFLASH_BLAS_LIBRARY})
  target_include_directories(dflash_blas INTERFACE ${DFLASH_CBLAS_INCLUDE_DIR})
  message(STATUS "dflash: BLAS = ${DFLASH_BLAS_LIBRARY} (OpenBLAS, OpenMP build)")
else()
  pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  add_library(dflash_blas INTERFACE)
  target_link_libraries(dflash_blas INTERFACE PkgConfig::OPENBLAS)
  message(WARNING "dflash: OpenMP build of OpenBLAS not found (Debian: libopenblas-openmp-dev); using "
                  "pkg-config openblas. BLAS calls inside OpenMP regions may oversubscribe the cores.")
endif()
