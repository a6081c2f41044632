// Status and Result<T>: Falcon's error values (STYLE.md rule 5).
//
// A Status is OK or carries a code and a human-readable message that says what failed and,
// where it helps, what to do. Result<T> holds either a value or a non-OK Status. Both are
// plain values: copyable, movable, thread-compatible (no shared state). Header-only, standard
// library only, so every part of Falcon except the exception-free shim may use them.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace falcon {

class [[nodiscard]] Status {
 public:
  enum class Code { kOk = 0, kInvalidArgument, kNotFound, kCorrupt, kUnavailable, kIoError, kInternal };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corrupt(std::string msg) { return Status(Code::kCorrupt, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg)); }
  static Status IoError(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ok", or "<code name>: <message>".
  std::string ToString() const {
    if (ok()) return "ok";
    return std::string(CodeName(code_)) + ": " + message_;
  }
  static const char* CodeName(Code c) {
    switch (c) {
      case Code::kOk: return "ok";
      case Code::kInvalidArgument: return "invalid argument";
      case Code::kNotFound: return "not found";
      case Code::kCorrupt: return "corrupt";
      case Code::kUnavailable: return "unavailable";
      case Code::kIoError: return "I/O error";
      case Code::kInternal: return "internal error";
    }
    return "?";
  }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Either a T or an error Status. REQUIRES: value() only when ok(); status() is Ok when ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}   // NOLINT: implicit by design
  bool ok() const { return std::holds_alternative<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace falcon
