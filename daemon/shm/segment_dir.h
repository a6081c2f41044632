// Discovery of shim segments in a directory (default /dev/shm): names, listing, liveness, reaping.
//
// Segments are named falcon.<uid>.<boot>.<pidns>.<pid> (shm_abi.h): unique on a node even when
// containers, each with its own PID namespace, share the directory with the agent. Names of
// ABI 4 and older (falcon.<uid>.<pid>) are ignored: never listed, never reaped. A reader of
// this ABI cannot read those segments, and a pid without its namespace says nothing about
// liveness, so removing them is left to whoever knows they are dead (rm by hand).
//
// Liveness (ClassifyWriter, from what WriterEvidence gathers):
//  - "exited": the process ran its exit handlers (FalconShmHeader::state).
//  - Writer in our PID namespace (same boot id and pid namespace inode): "live" while the pid
//    runs with the start time recorded in the header, else "orphaned". Exact, as before.
//  - Writer in another PID namespace (or one we cannot name): "live" while the shim's liveness
//    lock is held (exact in any namespace: the kernel drops it when the writer dies; a stopped or
//    frozen writer keeps it), or while its heartbeat is younger than the bound
//    (LivenessOptions::heartbeat_stale_ns, default kHeartbeatStaleNs), or when the shim keeps
//    no heartbeat (its service thread did not start): unknown counts as live. "Orphaned" needs
//    both signals to agree: no lock AND a kept heartbeat that stopped longer ago than the bound.
// Only "exited" and "orphaned" segments may be reaped (unlinked); ReapSegment checks again right
// before it unlinks. When in doubt a segment is live: a leftover costs a few MiB, a reaped live
// segment costs its rank's trace.
// Thread-compatible. Never writes to a segment; ReapSegment unlinks only names of dead writers.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "falcon/status.h"

namespace falcon::daemon {

class SegmentReader;

// A PID namespace of this node: the kernel's boot id and the namespace's inode number.
struct PidNamespace {
  std::array<uint8_t, 16> boot_id{};  // all zero: unknown
  uint64_t pid_ns = 0;                // 0: unknown
  bool known() const;
  bool operator==(const PidNamespace&) const = default;
};

// The reader's own PID namespace (read from /proc each call).
PidNamespace OwnPidNamespace();

// What a segment's file name says about its writer.
struct SegmentName {
  uint32_t uid = 0;
  PidNamespace ns;
  int32_t pid = 0;  // in ns
};

// Parses falcon.<uid>.<32 hex digits>.<pidns>.<pid>; nullopt for anything else, old names
// included.
std::optional<SegmentName> ParseSegmentName(std::string_view file_name);
std::string SegmentFileName(const SegmentName& name);
std::string SegmentPath(const std::string& dir, const SegmentName& name);

// A heartbeat older than this (and no lock) marks a writer in another PID namespace dead. The
// shim beats every 50 ms; 10 s leaves room for a starved VM or a long stop-the-world pause.
constexpr int64_t kHeartbeatStaleNs = 10'000'000'000;

struct LivenessOptions {
  int64_t heartbeat_stale_ns = kHeartbeatStaleNs;
};

struct SegmentInfo {
  std::string path;
  int32_t pid = -1;        // in the writer's PID namespace (pid_ns)
  uint32_t uid = 0;
  uint64_t pid_ns = 0;     // the writer's PID namespace inode, 0 if unknown
  bool own_namespace = false;  // the writer shares the reader's PID namespace: pid is ours too
  bool lock_held = false;  // the shim's liveness lock was held when listed
  uint64_t inode = 0;      // of the file listed; ReapSegment removes only this file
  enum class State { kLive, kExited, kOrphaned, kUnreadable } state = State::kUnreadable;
  std::string error;  // why kUnreadable
  std::string exe;
  std::string job;
  std::string host;
  int32_t rank_hint = -1;
  uint64_t records = 0;  // ring head
  uint64_t lost = 0;
  uint32_t comms = 0;
  int64_t created_real_ns = 0;
  int64_t heartbeat_real_ns = 0;
};

const char* SegmentStateName(SegmentInfo::State s);

// What a reader knows about a readable segment's writer.
struct WriterEvidence {
  bool exited = false;          // header state is kFalconProcExited
  bool same_namespace = false;  // writer's boot id and PID namespace are known and are ours
  bool pid_matches = false;     // same_namespace only: ProcessMatches(pid, pid_start_ticks)
  bool lock_held = false;       // the liveness lock is held (F_OFD_GETLK)
  bool heartbeat_kept = false;  // shim_flags has kFalconShimHeartbeat
  bool same_boot = false;       // boot ids known and equal: CLOCK_MONOTONIC is comparable
  int64_t heartbeat_mono_age_ns = 0;  // reader's CLOCK_MONOTONIC - heartbeat_mono_ns
  int64_t heartbeat_real_age_ns = 0;  // reader's CLOCK_REALTIME - heartbeat_real_ns
};

// The liveness rule of the file comment; pure. Never kUnreadable.
SegmentInfo::State ClassifyWriter(const WriterEvidence& e, const LivenessOptions& options);

// The state of an open segment's writer now (evidence gathered from the header, /proc, the
// lock on seg.path() and the clocks). A segment whose file was unlinked has no lock to test.
SegmentInfo::State WriterState(const SegmentReader& seg, const LivenessOptions& options = {});

// The default directory: $FALCON_SHM_DIR if set, else /dev/shm.
std::string DefaultSegmentDir();

// Lists segments in `dir` with names of this ABI; only `uid`'s unless all_users.
Result<std::vector<SegmentInfo>> ListSegments(const std::string& dir, uint32_t uid, bool all_users,
                                              const LivenessOptions& options = {});

// The segment of process `pid` as this process sees pids: a running process is looked up in its
// own PID namespace (/proc/<pid>/ns/pid and NSpid, so a container's process may be named by its
// pid here), any other pid in ours (an exited process's kept segment).
std::string SegmentPathOfPid(const std::string& dir, uint32_t uid, int32_t pid);

// True if `pid` (of our PID namespace) runs and started at `start_ticks` (0 = do not compare).
bool ProcessMatches(int32_t pid, uint64_t start_ticks);

// Unlinks a segment whose writer is gone (exited or orphaned), after checking again that it is
// still the file listed and still not live. Returns an error, and removes nothing, otherwise.
Status ReapSegment(const SegmentInfo& info, const LivenessOptions& options = {});

}  // namespace falcon::daemon
