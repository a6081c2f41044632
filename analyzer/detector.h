// The online fail-slow detector (FALCON §4.2, "BOCD+V"): one iteration time in, at most one alarm
// out. Pipeline per sample: log-time -> persistence filter (a run of at most `max_outlier_run`
// samples far from the current level is a spike or a checkpoint/evaluation pause and is dropped;
// a longer run is a change and is released) -> BOCD on the kept samples -> verification (the
// median after the change point differs from the median before by more than `min_change`).
// Alarms: `kSlow` when the level rises more than `min_change` above the healthy baseline (or, when
// already slow, above the previous slow level: ladders), `kRecovered` when a slow level falls back
// within `min_change` of the baseline. With verify = false the detector is plain BOCD: every
// change point with posterior > threshold is an alarm (up = slow, down = recovered).
// Everything is online: an alarm raised while pushing sample `at` used samples 0..at only.
// Memory per detector is bounded (see MemoryBytes); time per sample is O(max_hypotheses + 64).
// Thread-safety: plain value object; one owner at a time, no internal locking.
// Must never: read clocks, do I/O, throw on bad samples (they are reported as invalid).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "analyzer/bocd.h"

namespace falcon::analyzer {

struct DetectorOptions {
  BocdOptions bocd;                 // hazard 1/250, 16 run lengths kept
  double cp_threshold = 0.9;        // posterior probability of a change within `window` samples
  double min_change = 0.10;         // verification: |after / before - 1| must exceed this
  std::size_t window = 64;          // a change point is sought among the last `window` samples
  std::size_t warmup = 16;          // samples used to estimate the first level and noise
  double outlier_z = 4.0;           // robust sigmas from the level that make a sample suspect
  // Suspect runs this long or shorter are dropped as transients: single spikes, checkpoint or
  // evaluation pauses (1-2 iterations) and short bursts of slow iterations (a noisy neighbour).
  // A fail-slow made of outliers is therefore reported max_outlier_run samples after its onset.
  std::size_t max_outlier_run = 4;
  std::size_t min_post = 4;         // samples after the change point before it may be verified
  double noise_floor = 1e-4;        // lower bound on the log-time noise sigma (0.01 %)
  // Verification is one-sided at this many standard errors: the change must exceed min_change
  // by z * 1.2533 * sigma / sqrt(samples after the change point) (standard error of a median).
  double confidence_z = 1.0;
  // Correlated noise (an iteration's slowness carries into the next) makes a median of n samples
  // vary more than sigma / sqrt(n). The detector estimates the lag-1 autocorrelation rho from
  // the lag-2 and lag-1 differences of kept samples (E|y_t - y_t-2| / E|y_t - y_t-1| =
  // sqrt(1 + rho) for AR(1); differences ignore level changes) and widens the verification
  // margin by the long-run factor sqrt(1 + rho) / (1 - rho) (sigma comes from successive
  // differences, which see sqrt(1 - rho) of the marginal noise). rho below `rho_floor` is read
  // as estimation noise; rho_floor >= 1 never widens the margin.
  double rho_floor = 0.1;
  // A rise is verified only when the samples after the change point look like one level: their
  // robust spread (1.4826 x MAD) is at most this many noise sigmas. Bursts of spikes, whose sizes
  // vary far more than the noise, are waited out; a real level is not delayed. 0 disables.
  double level_spread_z = 3.0;
  std::size_t baseline_horizon = 256;  // healthy baseline: running mean of log time over this
  // A healthy sample above the baseline pulls it up by at most this many noise sigmas (Huber's
  // 1.345, one-sided: iteration-time noise is skewed slow). 0: a plain running mean.
  double baseline_clip_z = 1.345;
  bool verify = true;               // false: plain BOCD, no persistence filter, no 10 % test
};

enum class AlarmType : std::uint8_t { kSlow, kRecovered };

struct Alarm {
  AlarmType type = AlarmType::kSlow;
  std::uint64_t at = 0;      // index of the sample whose arrival raised the alarm
  std::uint64_t onset = 0;   // estimated first sample of the new level
  double ratio = 1.0;        // new level / healthy baseline (slowdown ratio)
  double probability = 0.0;  // BOCD posterior of a change within the window
  double level_seconds = 0.0;  // new level (median of the samples after the onset), seconds
};

enum class SampleStatus : std::uint8_t { kOk, kInvalid };

struct DetectorStep {
  SampleStatus status = SampleStatus::kOk;
  std::optional<Alarm> alarm;
};

class FailSlowDetector {
 public:
  explicit FailSlowDetector(const DetectorOptions& options = {});

  // Feeds the next iteration time (seconds, finite and > 0; others are reported as kInvalid and
  // still consume an index so that alarm indices stay aligned with the caller's series).
  [[nodiscard]] DetectorStep Push(double seconds);

  [[nodiscard]] bool slow() const { return slow_; }
  [[nodiscard]] std::uint64_t samples() const { return next_index_; }
  // Healthy baseline (seconds); 0 until warm-up completes.
  [[nodiscard]] double baseline_seconds() const;
  // Estimated lag-1 autocorrelation of the noise (0 for independent iteration times; 0 until
  // 32 kept samples have been seen) and the margin factor it gives (>= 1).
  [[nodiscard]] double noise_autocorrelation() const;
  [[nodiscard]] double margin_factor() const;
  [[nodiscard]] std::size_t MemoryBytes() const;

 private:
  struct Sample {
    std::uint64_t index;
    double y;  // log seconds
  };
  // Absorb: the sample joins BOCD, the history, the noise estimate and the baseline.
  // Feed: Absorb, then Verify as of sample index `at`.
  std::optional<Alarm> Feed(const Sample& s, std::uint64_t at);
  void Absorb(const Sample& s);
  std::optional<Alarm> Verify(std::uint64_t at);
  std::optional<Alarm> Decide(std::uint64_t at, std::uint64_t onset, double post, double pre,
                              double probability);
  void Warm();
  void UpdateBaseline(double y, double sigma);  // sigma: the current noise estimate
  double Level();
  double Sigma();

  DetectorOptions options_;
  Bocd bocd_;
  std::uint64_t next_index_ = 0;
  bool warm_ = false;
  bool slow_ = false;
  double baseline_ = 0.0;              // healthy log level (running mean of healthy samples)
  std::uint64_t baseline_n_ = 0;       // healthy samples averaged into baseline_
  // Running means (horizon as the baseline's) of |y_t - y_t-1| and |y_t - y_t-2| over kept
  // samples, each difference clipped at 3.75 x its running mean (about 3 standard deviations),
  // for the autocorrelation estimate.
  double lag1_ = 0.0, lag2_ = 0.0;
  std::uint64_t lag_n_ = 0;
  double slow_level_ = 0.0;            // current slow log level when slow_
  std::deque<Sample> kept_;            // kept samples, newest last (bounded by kHistory)
  std::uint64_t regime_kept_ = 0;      // kept samples since the current regime began
  std::vector<Sample> pending_;        // suspect samples held back (<= max_outlier_run + 1)
  std::optional<double> released_level_;  // median of the last released run until resolved
  std::deque<double> abs_diffs_;       // |y_i - y_{i-1}| of kept samples (bounded by kDiffs)
  std::vector<double> scratch_, scratch2_;
};

}  // namespace falcon::analyzer
