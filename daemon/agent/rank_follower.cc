// RankFollower. See rank_follower.h for the contract.
#include "daemon/agent/rank_follower.h"

#include <array>
#include <atomic>

namespace falcon::agent {
namespace {

template <typename T>
T LoadShared(const T& word) {
  // The segment's shared words are atomics by contract (shm_abi.h); the reader's view is const.
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_acquire);
}

// The analyzer's kind of each shim op: ParseOpKind of its name, worked out once rather than per
// record (a string search over the op names, for every call the rank issues).
analyzer::OpKind KindOf(std::uint8_t op) {
  static const auto kKinds = [] {
    std::array<analyzer::OpKind, 256> kinds{};
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      kinds[i] = analyzer::ParseOpKind(daemon::OpName(static_cast<std::uint16_t>(i)));
    }
    return kinds;
  }();
  return kKinds[op];
}

std::string Text(const char* s, std::size_t n) {
  std::size_t len = 0;
  while (len < n && s[len] != '\0') ++len;
  return std::string(s, len);
}

}  // namespace

const char* ModeName(std::uint32_t mode) {
  switch (mode) {
    case kFalconModeTrack: return "track";
    case kFalconModeProfile: return "profile";
    case kFalconModeSample: return "sample";
    default: return "off";
  }
}

std::optional<std::uint32_t> ModeFromName(std::string_view name) {
  if (name == "track") return kFalconModeTrack;
  if (name == "profile") return kFalconModeProfile;
  if (name == "sample") return kFalconModeSample;
  if (name == "off") return kFalconModeOff;
  return std::nullopt;
}

Result<std::unique_ptr<RankFollower>> RankFollower::Open(const daemon::SegmentInfo& info,
                                                         const FollowerOptions& options) {
  bool writable = true;
  Result<daemon::SegmentReader> seg =
      daemon::SegmentReader::Open(info.path, daemon::SegmentReader::Access::kReadWrite);
  if (!seg.ok()) {
    writable = false;
    seg = daemon::SegmentReader::Open(info.path, daemon::SegmentReader::Access::kReadOnly);
  }
  if (!seg.ok()) return seg.status();
  return std::unique_ptr<RankFollower>(
      new RankFollower(std::move(seg).value(), writable, options));
}

RankFollower::RankFollower(daemon::SegmentReader seg, bool writable, const FollowerOptions& options)
    : seg_(std::move(seg)),
      writable_(writable),
      options_(options),
      analysis_(options.analysis),
      signatures_(options.signatures),
      pid_(seg_.header().pid),
      job_(Text(seg_.header().job, FALCON_NAME_LEN)) {
  cursor_ = seg_.OldestCursor();  // what the ring still holds from before we came
}

void RankFollower::RefreshComms() {
  const std::uint32_t used = LoadShared(seg_.live_header().comm_used);
  if (used == comms_seen_ && !comms_.empty()) return;
  comms_ = daemon::MakeCommTable(seg_);
  comms_seen_ = used;
}

void RankFollower::Poll(daemon::SegmentReader::ReadMode mode, FollowerUpdate* out) {
  buf_.clear();
  const daemon::ReadStats st = seg_.Read(&cursor_, options_.read_batch, mode, &buf_);
  if (writable_) seg_.PublishCursor(cursor_);
  out->stats.read += st.read;
  out->stats.lost += st.lost;
  out->stats.torn += st.torn;
  records_ += st.read;
  lost_ += st.lost;
  signatures_.Lost(st.lost + st.torn);  // calls they cannot send, and blocks they cannot digest
  if (!buf_.empty()) RefreshComms();
  for (const FalconRecord& r : buf_) {
    // The benchmark executor's passes during a validation pause are not training: they would
    // break the period lock (a burst of one call) and skew the communicator profile.
    if ((r.flags & kFalconFlagBenchmark) != 0) continue;
    if (r.op == kFalconOpAnnotation) {  // planned pauses: the framework's phases, our own pauses
      if (r.count == kFalconAnnotatePhase) analysis_.Quiet(r.t_start_ns, QuietSource::kPhase, r.peer != 0);
      if (r.count == kFalconAnnotatePauseBegin) analysis_.Quiet(r.t_start_ns, QuietSource::kPause, true);
      if (r.count == kFalconAnnotatePauseEnd) analysis_.Quiet(r.t_start_ns, QuietSource::kPause, false);
      continue;
    }
    const auto comm = r.comm_slot == FALCON_NO_COMM ? comms_.end() : comms_.find(r.comm_slot);
    if (r.comm_slot != FALCON_NO_COMM && comm == comms_.end()) {
      comms_seen_ = 0;  // a communicator newer than our table: refresh on the next poll
      if (r.comm_seq != ~std::uint64_t{0}) signatures_.Lost(1);  // a call of an unknown communicator
    }
    pattern_.Push(r, comm == comms_.end() ? 0 : comm->second.comm_id);
    analyzer::CallRecord call;
    call.op = KindOf(r.op);
    call.comm = comm == comms_.end() ? 0 : comm->second.comm_id;
    call.bytes = r.count * daemon::DtypeSize(r.dtype);
    call.peer = r.peer;
    call.t_ns = r.t_start_ns;
    analysis_.Push(call);
    if (comm != comms_.end()) {
      profiler_.Add(r, comm->second);
      if (r.comm_seq != ~std::uint64_t{0}) signatures_.Push(r, comm->second.comm_id, comm->second.nranks);
    }
    else if (r.op == kFalconOpGroupEnd || r.op == kFalconOpGpuTiming) profiler_.Observe(r);
  }
  const std::size_t had = out->analysis.samples.size();
  analysis_.Flush(&out->analysis);
  if (out->analysis.samples.size() > had) {
    const RankSample& last = out->analysis.samples.back();
    pattern_.SetIteration(last.start_ns, last.index);
  }
}

Result<CallPatternReport> RankFollower::CutPattern() const {
  if (!analysis_.locked()) return Status::Unavailable("no iteration period locked yet");
  std::vector<PatternCommInfo> comms;
  for (const auto& [slot, c] : comms_) {
    if (c.state == kFalconCommDestroyed) continue;
    comms.push_back({c.comm_id, c.nranks, seg_.CommCalls(slot), slot, c.rank});
  }
  return pattern_.Build(analysis_.period(), comms);
}

std::uint64_t RankFollower::RequestMode(std::uint32_t mode, std::uint32_t sample_every) {
  if (!writable_) return 0;
  seg_.RequestMode(mode, sample_every);
  return LoadShared(seg_.control().command_seq);
}

bool RankFollower::ModeApplied(std::uint64_t seq) const {
  return seq != 0 && LoadShared(seg_.control().command_ack) >= seq;
}

std::string RankFollower::mode_name() const {
  return ModeName(LoadShared(seg_.control().active_mode));
}

std::int64_t RankFollower::real_minus_mono_ns() const {
  return LoadShared(seg_.live_header().real_minus_mono_ns);
}

std::int64_t RankFollower::rank() const {
  if (seg_.header().rank_hint >= 0) return seg_.header().rank_hint;
  std::int64_t rank = -1;
  std::int32_t best = 0;
  for (const auto& [slot, c] : comms_) {
    if (c.nranks > best) {
      best = c.nranks;
      rank = c.rank;
    }
  }
  return rank;
}

daemon::SegmentProgress RankFollower::Progress(std::int64_t now_mono_ns, std::size_t per_comm) const {
  daemon::ProgressReadOptions o;
  o.per_comm = per_comm;
  return daemon::ReadProgress(seg_, now_mono_ns, o);
}

protocol::RankRegistration RankFollower::Registration() const {
  const FalconShmHeader& h = seg_.header();
  protocol::RankRegistration r;
  r.rank = rank();
  r.pid = pid_;
  r.local_rank = h.local_rank_hint;
  r.exe = Text(h.exe, FALCON_NAME_LEN);
  r.state = state;
  r.started_ns = h.created_real_ns;
  r.mode = mode_name();
  for (const auto& [slot, c] : comms_) {
    if (c.state == kFalconCommDestroyed) continue;
    r.comms.push_back({c.comm_id, c.rank, c.nranks, Text(c.name, FALCON_NAME_LEN), seg_.CommCalls(slot)});
  }
  r.records = records_;
  r.lost = lost_;
  if (analysis_.locked()) r.period = analysis_.period();
  r.iterations = analysis_.samples();
  r.slow = analysis_.slow();
  if (const std::uint32_t v = plan_version(); v > 0) r.plan_delivered = v;
  static constexpr const char* kPhases[] = {"train", "checkpoint", "eval", "dataload", "other"};
  const std::uint32_t phase = LoadShared(seg_.control().phase);
  if (phase != 0 && phase < 5) r.phase = kPhases[phase];
  r.excluded = analysis_.excluded();
  const daemon::PlanAcks acks = plan_acks();
  if (acks.applied > 0) r.plan_applied = acks.applied;
  if (acks.rejected > 0) r.plan_rejected = acks.rejected;
  std::optional<double>* costs[] = {&r.cost_s2, &r.cost_s3, &r.cost_s4, &r.cost_s5};
  for (int i = 0; i < 4; ++i) {
    if (acks.cost_s[i] >= 0) *costs[i] = acks.cost_s[i];
  }
  return r;
}

}  // namespace falcon::agent
