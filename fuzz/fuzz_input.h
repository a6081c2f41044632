// The fuzz targets' entry point and a reader that turns the fuzzer's bytes into typed values.
//
// Every target defines LLVMFuzzerTestOneInput. Built with clang and -fsanitize=fuzzer
// (FALCON_FUZZ=ON, preset "fuzz"), libFuzzer drives it; built otherwise, replay_main.cc runs it
// over the seed corpus and the saved regressions, so every CI build replays them. The reader is
// ours, not clang's FuzzedDataProvider, because that header is not on a GCC build's path.
// Thread-safety: a FuzzInput belongs to one thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace falcon::fuzz {

// Reads from the front of the input; once it runs out every read yields zeros / empty strings.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  bool empty() const { return pos_ >= size_; }

  template <class T>
  T Take() {
    T v{};
    const size_t n = remaining() < sizeof(T) ? remaining() : sizeof(T);
    if (n > 0) std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  // A value in [lo, hi].
  uint64_t Range(uint64_t lo, uint64_t hi) {
    const uint64_t span = hi - lo;
    const uint64_t raw = Take<uint32_t>();
    return span == UINT64_MAX ? raw : lo + raw % (span + 1);
  }
  bool Bool() { return (Take<uint8_t>() & 1) != 0; }
  // Up to `max` bytes.
  std::string_view Bytes(size_t max) {
    const size_t n = remaining() < max ? remaining() : max;
    std::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return v;
  }
  std::string_view Rest() { return Bytes(remaining()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A property a target checks failed: abort, which the fuzzer reports as a crash with the input.
[[noreturn]] inline void PropertyFailed(const char* what) {
  std::fprintf(stderr, "fuzz property failed: %s\n", what);
  std::abort();
}

}  // namespace falcon::fuzz
