// The progress document (progress_json.h): RankProgress to JSON and back, with the path of the
// first bad value in every parse error.
#include "daemon/shm/progress_json.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "daemon/shm/record_json.h"
#include "falcon/shm_abi.h"

namespace falcon::daemon {
namespace {

using nlohmann::json;
using analyzer::CommProgress;
using analyzer::IssuedCall;
using analyzer::RankProgress;

// Thrown inside ParseProgress only, caught there: the message is the error it returns.
struct BadValue : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Fail(const std::string& path, const std::string& what) { throw BadValue(path + ": " + what); }

const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const json& Need(const json& obj, const char* key, const std::string& path) {
  const json* v = Find(obj, key);
  if (v == nullptr) Fail(path + "." + key, "missing");
  return *v;
}

std::uint64_t Unsigned(const json& v, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  Fail(path, "expected a non-negative integer");
}

std::int64_t Signed(const json& v, const std::string& path, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer()) Fail(path, "expected an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) Fail(path, "out of range");
  const std::int64_t x = v.get<std::int64_t>();
  if (x < lo || x > hi) Fail(path, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

std::string String(const json& v, const std::string& path) {
  if (!v.is_string()) Fail(path, "expected a string");
  return v.get<std::string>();
}

// 1 to 16 hex digits, an optional 0x in front.
std::uint64_t HexValue(const json& v, const std::string& path) {
  std::string s = String(v, path);
  if (s.starts_with("0x") || s.starts_with("0X")) s.erase(0, 2);
  if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    Fail(path, "expected up to 16 hex digits, got \"" + v.get<std::string>() + "\"");
  }
  return std::strtoull(s.c_str(), nullptr, 16);
}

std::uint8_t OpCode(const std::string& name, const std::string& path) {
  for (unsigned op = 1; op <= kFalconOpMemFree; ++op) {
    if (name == OpName(static_cast<std::uint16_t>(op))) return static_cast<std::uint8_t>(op);
  }
  Fail(path, "unknown op \"" + name + "\" (expected an NCCL call name such as AllReduce or Send)");
}

std::uint8_t DtypeCode(const std::string& name, const std::string& path) {
  for (unsigned d = 0; d < 0xFF; ++d) {
    const char* n = DtypeName(static_cast<std::uint8_t>(d));
    if (n == nullptr) break;
    if (name == n) return static_cast<std::uint8_t>(d);
  }
  Fail(path, "unknown dtype \"" + name + "\" (expected int8 ... float8e5m2, as in the call-record dump)");
}

std::int16_t RedOpCode(const std::string& name, const std::string& path) {
  for (std::int32_t r = 0; r <= 5; ++r) {
    if (name == RedOpName(r)) return static_cast<std::int16_t>(r);
  }
  Fail(path, "unknown redop \"" + name + "\" (expected sum, prod, max, min, avg or premulsum)");
}

const json& Array(const json& obj, const char* key, const std::string& path) {
  const json& v = Need(obj, key, path);
  if (!v.is_array()) Fail(path + "." + key, "expected an array");
  return v;
}

CommProgress ParseComm(const json& j, const std::string& path) {
  if (!j.is_object()) Fail(path, "expected an object");
  CommProgress c;
  c.comm = HexValue(Need(j, "comm", path), path + ".comm");
  c.nranks = static_cast<std::int32_t>(Signed(Need(j, "nranks", path), path + ".nranks", 1, INT32_MAX));
  c.comm_rank = static_cast<std::int32_t>(Signed(Need(j, "comm_rank", path), path + ".comm_rank", 0, INT32_MAX));
  if (c.comm_rank >= c.nranks) Fail(path + ".comm_rank", "must be below nranks (" + std::to_string(c.nranks) + ")");
  c.issued = Unsigned(Need(j, "issued", path), path + ".issued");
  c.completed = Unsigned(Need(j, "completed", path), path + ".completed");
  if (c.completed > c.issued) Fail(path + ".completed", "exceeds issued (" + std::to_string(c.issued) + ")");
  if (const json* n = Find(j, "name")) c.name = String(*n, path + ".name");
  if (const json* k = Find(j, "completion_known")) {
    if (!k->is_boolean()) Fail(path + ".completion_known", "expected true or false");
    c.completion_known = k->get<bool>();
  }
  return c;
}

IssuedCall ParseCall(const json& j, const std::string& path) {
  if (!j.is_object()) Fail(path, "expected an object");
  IssuedCall c;
  c.comm = HexValue(Need(j, "comm", path), path + ".comm");
  c.seq = Unsigned(Need(j, "seq", path), path + ".seq");
  c.sig.op = OpCode(String(Need(j, "op", path), path + ".op"), path + ".op");
  c.sig.count = Unsigned(Need(j, "count", path), path + ".count");
  if (const json* v = Find(j, "dtype")) c.sig.dtype = DtypeCode(String(*v, path + ".dtype"), path + ".dtype");
  if (const json* v = Find(j, "redop")) c.sig.redop = RedOpCode(String(*v, path + ".redop"), path + ".redop");
  if (const json* v = Find(j, "peer")) c.sig.peer = static_cast<std::int32_t>(Signed(*v, path + ".peer", -1, INT32_MAX));
  if (const json* v = Find(j, "stream")) c.stream = HexValue(*v, path + ".stream");
  if (const json* v = Find(j, "group")) c.group = Unsigned(*v, path + ".group");
  if (const json* v = Find(j, "completed")) {
    if (!v->is_boolean()) Fail(path + ".completed", "expected true or false");
    c.completed = v->get<bool>();
  }
  if (const json* v = Find(j, "issue_ns")) c.issue_ns = Signed(*v, path + ".issue_ns", 0, INT64_MAX);
  return c;
}

RankProgress ParseRank(const json& j, const std::string& path) {
  if (!j.is_object()) Fail(path, "expected an object");
  RankProgress r;
  r.rank = Signed(Need(j, "rank", path), path + ".rank", 0, INT64_MAX);
  if (const json* h = Find(j, "host")) r.host = String(*h, path + ".host");
  if (const json* c = Find(j, "in_call")) r.in_call = HexValue(*c, path + ".in_call");
  const json& comms = Array(j, "comms", path);
  for (std::size_t i = 0; i < comms.size(); ++i) {
    r.comms.push_back(ParseComm(comms[i], path + ".comms[" + std::to_string(i) + "]"));
  }
  if (const json* recent = Find(j, "recent")) {
    if (!recent->is_array()) Fail(path + ".recent", "expected an array");
    for (std::size_t i = 0; i < recent->size(); ++i) {
      r.recent.push_back(ParseCall((*recent)[i], path + ".recent[" + std::to_string(i) + "]"));
    }
  }
  return r;
}

}  // namespace

json ProgressToJson(std::span<const RankProgress> ranks, std::string_view source) {
  json doc = {{"format", "falcon-progress"}, {"version", kProgressFormatVersion}, {"source", std::string(source)}};
  json out = json::array();
  for (const RankProgress& r : ranks) {
    json comms = json::array();
    for (const CommProgress& c : r.comms) {
      comms.push_back({{"comm", HexId(c.comm)},
                       {"name", c.name},
                       {"nranks", c.nranks},
                       {"comm_rank", c.comm_rank},
                       {"issued", c.issued},
                       {"completed", c.completed},
                       {"completion_known", c.completion_known}});
    }
    json recent = json::array();
    for (const IssuedCall& c : r.recent) {
      const char* dtype = DtypeName(c.sig.dtype);
      const char* redop = RedOpName(c.sig.redop);
      recent.push_back({{"comm", HexId(c.comm)},
                        {"seq", c.seq},
                        {"op", OpName(c.sig.op)},
                        {"dtype", dtype != nullptr ? json(dtype) : json(nullptr)},
                        {"redop", redop != nullptr ? json(redop) : json(nullptr)},
                        {"peer", c.sig.peer},
                        {"count", c.sig.count},
                        {"stream", c.stream != 0 ? json(HexId(c.stream)) : json(nullptr)},
                        {"group", c.group},
                        {"completed", c.completed},
                        {"issue_ns", c.issue_ns}});
    }
    out.push_back({{"rank", r.rank},
                   {"host", r.host},
                   {"in_call", r.in_call ? json(HexId(*r.in_call)) : json(nullptr)},
                   {"comms", std::move(comms)},
                   {"recent", std::move(recent)}});
  }
  doc["ranks"] = std::move(out);
  return doc;
}

std::optional<RankProgress> ParseProgressRank(const json& rank, std::string* error) {
  try {
    return ParseRank(rank, "rank");
  } catch (const BadValue& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  } catch (const json::exception& e) {
    if (error != nullptr) *error = std::string("malformed progress: ") + e.what();
    return std::nullopt;
  }
}

std::optional<ProgressDocument> ParseProgress(const json& doc, std::string* error) {
  try {
    if (!doc.is_object()) Fail("document", "expected a JSON object");
    const json* format = Find(doc, "format");
    if (format == nullptr || !format->is_string() || format->get<std::string>() != "falcon-progress") {
      Fail("format", "expected \"falcon-progress\"");
    }
    const std::int64_t version = Signed(Need(doc, "version", "document"), "version", 1, INT32_MAX);
    if (version > kProgressFormatVersion) {
      Fail("version", std::to_string(version) + " is newer than this falcon-ctl reads (" +
                          std::to_string(kProgressFormatVersion) + ")");
    }
    ProgressDocument out;
    if (const json* s = Find(doc, "source")) out.source = String(*s, "source");
    const json& ranks = Array(doc, "ranks", "document");
    for (std::size_t i = 0; i < ranks.size(); ++i) out.ranks.push_back(ParseRank(ranks[i], "ranks[" + std::to_string(i) + "]"));
    return out;
  } catch (const BadValue& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  } catch (const json::exception& e) {  // a type surprise the checks above missed
    if (error != nullptr) *error = std::string("malformed progress document: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace falcon::daemon
