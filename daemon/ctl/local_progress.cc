// ReadLocalProgress (local_progress.h).
#include "daemon/ctl/local_progress.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "daemon/shm/segment_reader.h"

namespace falcon::ctl {

Result<std::vector<LocalRank>> ReadLocalProgress(const LocalProgressOptions& options) {
  const std::string dir = options.dir.empty() ? daemon::DefaultSegmentDir() : options.dir;
  auto listed = daemon::ListSegments(dir, static_cast<uint32_t>(getuid()), options.all_users);
  if (!listed.ok()) return listed.status();
  std::vector<LocalRank> out;
  for (const daemon::SegmentInfo& s : listed.value()) {
    if (s.state == daemon::SegmentInfo::State::kUnreadable) {
      std::fprintf(stderr, "falcon-ctl: skipping %s: %s\n", s.path.c_str(), s.error.c_str());
      continue;
    }
    if (s.state != daemon::SegmentInfo::State::kLive && !options.include_exited) continue;
    if (!options.job.empty() && s.job != options.job) continue;
    auto seg = daemon::SegmentReader::Open(s.path);
    if (!seg.ok()) {  // gone or replaced since it was listed
      std::fprintf(stderr, "falcon-ctl: skipping %s: %s\n", s.path.c_str(), seg.status().message().c_str());
      continue;
    }
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const std::int64_t now_ns = static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
    out.push_back({s, daemon::ReadProgress(seg.value(), now_ns, options.read), now_ns});
  }
  std::sort(out.begin(), out.end(), [](const LocalRank& a, const LocalRank& b) {
    return std::tie(a.progress.progress.rank, a.info.pid) < std::tie(b.progress.progress.rank, b.info.pid);
  });
  return out;
}

}  // namespace falcon::ctl
