# Warning and sanitizer flags for Falcon's own targets (never applied to third-party code).
# falcon_target_defaults(<target>) gives a target the project's warnings (errors when
# FALCON_WERROR is on) and the sanitizer chosen with FALCON_SANITIZE.

set(FALCON_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Wunused -Woverloaded-virtual -Wconversion -Wno-sign-conversion
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
set(FALCON_C_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wformat=2)
# GCC 12 at -O2/-O3 reports -Wrestrict on std::string assignments and concatenations inlined from
# libstdc++ (GCC bugs 105329, 105651: false positives, fixed in GCC 13). With -Werror every
# optimised build would fail on correct code, so GCC 12 gets the warning off.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND FALCON_WARNING_FLAGS -Wno-restrict)
endif()

set(FALCON_SANITIZER_FLAGS "")
set(FALCON_SANITIZER_COMPILE_ONLY_FLAGS "")
if(FALCON_SANITIZE STREQUAL "address")
  set(FALCON_SANITIZER_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined)
elseif(FALCON_SANITIZE STREQUAL "thread")
  # -Wno-tsan: GCC warns that TSan does not model atomic_thread_fence. Our seqlocks use fences
  # only for ordering; every shared access is itself atomic, so TSan still checks every race.
  set(FALCON_SANITIZER_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
  set(FALCON_SANITIZER_COMPILE_ONLY_FLAGS -Wno-tsan)
elseif(NOT FALCON_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FALCON_SANITIZE must be '', 'address' or 'thread', not '${FALCON_SANITIZE}'")
endif()

# FALCON_FUZZ: every Falcon target carries libFuzzer's coverage instrumentation (the fuzz
# executables link libFuzzer itself, fuzz/CMakeLists.txt); only clang has it.
if(FALCON_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FALCON_FUZZ needs clang (libFuzzer): configure with the 'fuzz' preset")
  endif()
  list(APPEND FALCON_SANITIZER_FLAGS -fsanitize=fuzzer-no-link)
endif()

function(falcon_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${FALCON_WARNING_FLAGS}>
    $<$<COMPILE_LANGUAGE:C>:${FALCON_C_WARNING_FLAGS}>
    ${FALCON_SANITIZER_FLAGS} ${FALCON_SANITIZER_COMPILE_ONLY_FLAGS})
  if(FALCON_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(FALCON_SANITIZER_FLAGS)
    target_link_options(${target} PRIVATE ${FALCON_SANITIZER_FLAGS})
  endif()
endfunction()
