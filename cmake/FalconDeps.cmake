# Third-party dependencies. All come from Debian packages installed by scripts/setup.sh, except
# the CUDA toolkit / NCCL headers, found under $CUDA_HOME or /usr/local/cuda.
find_package(Threads REQUIRED)

# nccl.h (and the CUDA headers it includes). Only shim/ and bench/ may link falcon::nccl_headers.
set(FALCON_CUDA_HOME "$ENV{CUDA_HOME}" CACHE PATH "CUDA toolkit root holding include/nccl.h")
if(NOT FALCON_CUDA_HOME)
  set(FALCON_CUDA_HOME /usr/local/cuda)
endif()
find_path(FALCON_NCCL_INCLUDE_DIR nccl.h HINTS ${FALCON_CUDA_HOME}/include NO_DEFAULT_PATH)
find_path(FALCON_CUDA_INCLUDE_DIR cuda_runtime.h HINTS ${FALCON_CUDA_HOME}/include NO_DEFAULT_PATH)
if(NOT FALCON_NCCL_INCLUDE_DIR OR NOT FALCON_CUDA_INCLUDE_DIR)
  message(FATAL_ERROR "nccl.h / cuda_runtime.h not found under ${FALCON_CUDA_HOME}/include. "
                      "Set CUDA_HOME (or -DFALCON_CUDA_HOME=...) to the CUDA toolkit root.")
endif()
file(STRINGS ${FALCON_NCCL_INCLUDE_DIR}/nccl.h _falcon_nccl_ver REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
message(STATUS "Falcon: nccl.h in ${FALCON_NCCL_INCLUDE_DIR} (${_falcon_nccl_ver})")
add_library(falcon_nccl_headers INTERFACE)
add_library(falcon::nccl_headers ALIAS falcon_nccl_headers)
# SYSTEM: warnings in the toolkit's headers are not ours to fix.
target_include_directories(falcon_nccl_headers SYSTEM INTERFACE
  ${FALCON_NCCL_INCLUDE_DIR} ${FALCON_CUDA_INCLUDE_DIR})
set(FALCON_NCCL_HEADER ${FALCON_NCCL_INCLUDE_DIR}/nccl.h)

if(FALCON_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(FALCON_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
if(FALCON_BUILD_DAEMONS)
  find_package(nlohmann_json 3.10 REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(spdlog REQUIRED)
  # The agent and controller: hiredis (Redis client), Boost.Asio/Beast (event loop, HTTP metrics).
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis>=0.14)
  find_package(Boost 1.74 REQUIRED COMPONENTS system)
  # falcon-controller's allocator. Its loop and its reader thread parse and free JSON by the
  # million (acks, reports, every rank's registration); with tcmalloc's per-thread caches the
  # controller took 0.76-0.79 cores at 16,384 ranks against 0.96 with glibc's malloc
  # (docs/benchmarks.md). Sanitizers and libFuzzer bring their own allocator: glibc's there.
  set(FALCON_CONTROLLER_TCMALLOC OFF)
  set(_falcon_instrumented OFF)
  if(FALCON_SANITIZE OR FALCON_FUZZ)
    set(_falcon_instrumented ON)
  endif()
  if(FALCON_CONTROLLER_MALLOC STREQUAL "tcmalloc")
    if(_falcon_instrumented)
      message(FATAL_ERROR "FALCON_CONTROLLER_MALLOC=tcmalloc cannot go with a sanitizer or fuzzing build: use auto or system")
    endif()
    pkg_check_modules(TCMALLOC REQUIRED IMPORTED_TARGET libtcmalloc_minimal)
    set(FALCON_CONTROLLER_TCMALLOC ON)
  elseif(FALCON_CONTROLLER_MALLOC STREQUAL "auto")
    if(NOT _falcon_instrumented)
      pkg_check_modules(TCMALLOC QUIET IMPORTED_TARGET libtcmalloc_minimal)
      set(FALCON_CONTROLLER_TCMALLOC ${TCMALLOC_FOUND})
    endif()
  elseif(NOT FALCON_CONTROLLER_MALLOC STREQUAL "system")
    message(FATAL_ERROR "FALCON_CONTROLLER_MALLOC must be auto, tcmalloc or system, not '${FALCON_CONTROLLER_MALLOC}'")
  endif()
  if(FALCON_CONTROLLER_TCMALLOC)
    message(STATUS "Falcon: falcon-controller allocates with tcmalloc_minimal ${TCMALLOC_VERSION}")
  elseif(_falcon_instrumented)
    message(STATUS "Falcon: falcon-controller allocates with the C library's malloc (a sanitizer or fuzzing build)")
  else()
    message(STATUS "Falcon: falcon-controller allocates with the C library's malloc "
                   "(FALCON_CONTROLLER_MALLOC=${FALCON_CONTROLLER_MALLOC}; libgoogle-perftools-dev for tcmalloc)")
  endif()
endif()
