// HangStage: the controller's hang diagnosis (docs/hangs.md, "Incidents"). Its own unit with its
// own state and log prefix (event=hang_*); Controller only feeds it messages and carries out
// what it asks (commands to send, incident entries to write).
//
//  - Agents report ranks that stall (`stall` messages on falcon:{job}:stalls; agent
//    StallWatch): no ordered NCCL call for longer than their bound with work outstanding. The
//    last report of each rank wins; ranks that are no longer live are dropped.
//  - While some rank is stalled a hang *episode* is open, with its own incident id. The stage
//    asks every agent of the job for its ranks' progress (a `progress` command), waits for the
//    answers up to answer_wait_s, merges them and runs analyzer::DiagnoseHang on the whole job.
//  - Each finding becomes an incident entry once per episode: stage `hang` (ranks that never
//    issued the calls others wait in: one entry per set of culprits, every call it holds up in
//    its detail; or work that does not complete: one per communicator and seq, which also takes
//    the calls never issued by ranks held behind that work), `mismatch`,
//    `deadlock` or `disorder`, naming the culprit ranks and their hosts, the communicators, seq
//    and op, with the evidence (wait chains, signatures, who waits). A
//    diagnosis that names nothing, before any did, is written once as a `hang` entry that says
//    so. While the
//    episode stays open the diagnosis is repeated every repeat_s (a picture that changed, a
//    finding that was not visible yet).
//  - When every stalled rank makes progress again the episode ends with a `resolution` entry.
// Thread-safety: a value type for one thread (the controller loop). Must never: do I/O, read a
// clock (times are the caller's), or trust a message it was not given validated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analyzer/hang_diagnosis.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/validation_run.h"

namespace falcon::controller {

struct HangStageOptions {
  double answer_wait_s = 5;  // longest wait for the agents' progress answers
  double repeat_s = 30;      // diagnose an open episode again after this long
  int calls = 16;            // latest calls per communicator asked of each rank
};

// One incident stream entry the stage asks for (Controller::Record writes it).
struct HangRecord {
  std::string stage;     // hang | mismatch | deadlock | disorder | resolution
  std::string summary;
  nlohmann::json fields;  // id, at_ns, ranks, comms, detail
  const char* severity = "critical";
};

class HangStage {
 public:
  explicit HangStage(HangStageOptions options = {}) : options_(options) {}

  // A validated `stall` message.
  void OnStall(const nlohmann::json& m);
  // A validated ack: true when it answers one of this stage's commands (and is taken).
  bool OnAck(const nlohmann::json& m);
  // Called every loop turn: drops stalled ranks the view no longer has, opens or ends the
  // episode, returns the progress commands to send now (one per agent host of `view`).
  std::vector<OutgoingCommand> Next(const JobView& view, std::int64_t now_ns);
  // Incident entries to write, oldest first (drained). If writing one fails, hand it back with
  // Unwritten so it is written next turn.
  std::vector<HangRecord> TakeRecords();
  void Unwritten(std::vector<HangRecord> records);

  const std::map<std::int64_t, nlohmann::json>& stalled() const { return stalled_; }
  bool investigating() const { return !asked_.empty(); }
  const std::string& episode() const { return episode_; }
  std::uint64_t episodes() const { return episodes_; }
  std::uint64_t diagnoses() const { return diagnoses_; }

 private:
  void Conclude(const JobView& view, std::int64_t now_ns);
  // One entry for `group`: findings of one kind and, for calls never issued, the same culprits.
  HangRecord FindingRecord(const std::vector<const analyzer::Finding*>& group, const JobView& view,
                           std::int64_t now_ns) const;

  HangStageOptions options_;
  std::map<std::int64_t, nlohmann::json> stalled_;  // rank -> its stall report
  std::string episode_;                             // open episode's incident id, "" none
  std::int64_t episode_opened_ns_ = 0;
  std::uint64_t episodes_ = 0;
  std::uint64_t diagnoses_ = 0;
  std::uint64_t commands_ = 0;
  std::int64_t next_diagnosis_ns_ = 0;
  // The diagnosis under way: commands sent (id -> host), answers so far, deadline.
  std::map<std::string, std::string> asked_;
  std::vector<nlohmann::json> answers_;  // results[].progress of the answered acks
  std::set<std::string> answered_hosts_;
  std::int64_t answers_deadline_ns_ = 0;
  std::set<std::string> reported_;  // findings of this episode already recorded (kind/comm/seq)
  bool reported_nothing_ = false;
  std::vector<HangRecord> records_;
};

// The incident entry of `group` (findings of one kind; for calls never issued, the same
// culprits): stage, summary naming the culprits and their hosts, fields {id, at_ns, ranks,
// comms, detail {kind, comm, seq, culprits, waiting, hosts, chain, signatures, findings,
// stalled}}. `id`: the incident id; `stalled`: the ranks stalled when it was found.
HangRecord FindingEntry(const std::vector<const analyzer::Finding*>& group, const JobView& view, std::int64_t now_ns,
                        const std::string& id, const std::vector<std::int64_t>& stalled);

// The incident stage of a finding: hang (not issued, not completing), mismatch, deadlock, disorder.
const char* HangStageName(analyzer::FindingKind k);

}  // namespace falcon::controller
