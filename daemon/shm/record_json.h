// Names and JSON for call records: the one place that turns shm_abi.h codes into text.
//
// The JSON-lines form written by `falcon-ctl trace --json` (and read by
// `falcon-ctl analyze-trace --records`) is versioned by kRecordSchemaVersion; its fields are
// documented in README.md ("Call-record dump"). Pure functions; thread-safe.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <map>

#include "daemon/shm/segment_reader.h"
#include "falcon/shm_abi.h"

namespace falcon::daemon {

inline constexpr int kRecordSchemaVersion = 1;

const char* OpName(uint16_t op);          // "AllReduce", ... or "Unknown"
const char* DtypeName(uint8_t dtype);     // "float32", ... or nullptr if none/unknown
const char* RedOpName(int32_t redop);     // "sum", ..., "premulsum" for dynamic ops, nullptr if none
const char* ResultName(int32_t result);   // "ncclSuccess", ...
uint64_t DtypeSize(uint8_t dtype);        // bytes per element, 0 if none/unknown
std::string HexId(uint64_t id);           // 16 lower-case hex digits

// Comm slot → entry, for attributing records.
using CommTable = std::map<uint32_t, FalconCommEntry>;
CommTable MakeCommTable(const SegmentReader& seg);

// A record's index in its lane (from its seqlock version).
inline uint64_t RecordIndex(const FalconRecord& r) { return r.version / 2 - 1; }

// One record as a JSON object (see README "Call-record dump").
nlohmann::json RecordToJson(const FalconRecord& r, const FalconShmHeader& h, const CommTable& comms);

}  // namespace falcon::daemon
