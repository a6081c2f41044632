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
endif()
