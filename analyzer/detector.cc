// BOCD + verification. See detector.h for the contract.
#include "analyzer/detector.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "analyzer/robust.h"

namespace falcon::analyzer {
namespace {

constexpr std::size_t kHistory = 256;    // kept samples remembered (>= window + kPreSamples)
constexpr std::size_t kDiffs = 64;       // successive differences for the noise estimate
constexpr std::size_t kLevelSamples = 16;  // recent regime samples for the current level
constexpr std::size_t kPreSamples = 64;    // samples before a change point for verification
constexpr std::size_t kSmallPost = 5;      // up to this many post samples, spread = half range
constexpr double kLagClip = 3.75;          // clip of a lag difference, in its running mean |d|

// Spread of the samples after a change point, in the units of a noise sigma: for a handful of
// samples the half range (a median-based scale of 3 or 4 values ignores the disagreeing ones),
// then 1.4826 x MAD, which tolerates a minority of spikes inside a real level.
double LevelSpread(std::span<const double> post, std::vector<double>& scratch) {
  if (post.size() <= kSmallPost) {
    const auto [lo, hi] = std::minmax_element(post.begin(), post.end());
    return 0.5 * (*hi - *lo);
  }
  return RobustSigma(post, scratch);
}

}  // namespace

FailSlowDetector::FailSlowDetector(const DetectorOptions& options)
    : options_(options), bocd_(options.bocd) {
  options_.window = std::clamp<std::size_t>(options_.window, 2, kHistory - kPreSamples);
  options_.warmup = std::max<std::size_t>(options_.warmup, 3);
  options_.min_post = std::clamp<std::size_t>(options_.min_post, 1, options_.window);
}

double FailSlowDetector::baseline_seconds() const { return warm_ ? std::exp(baseline_) : 0.0; }

std::size_t FailSlowDetector::MemoryBytes() const {
  return sizeof(*this) + bocd_.MemoryBytes() + kHistory * sizeof(Sample) +
         kDiffs * sizeof(double) + (pending_.capacity() + scratch_.capacity() +
                                    scratch2_.capacity()) * sizeof(double) * 2;
}

double FailSlowDetector::Level() {
  const std::size_t n = static_cast<std::size_t>(
      std::min<std::uint64_t>({regime_kept_, kLevelSamples, kept_.size()}));
  scratch2_.clear();
  for (std::size_t i = kept_.size() - std::max<std::size_t>(n, 1); i < kept_.size(); ++i) {
    scratch2_.push_back(kept_[i].y);
  }
  std::vector<double> values(scratch2_);
  return Median(values, scratch_);
}

double FailSlowDetector::Sigma() {
  if (abs_diffs_.empty()) {
    return options_.noise_floor;
  }
  std::vector<double> values(abs_diffs_.begin(), abs_diffs_.end());
  // |y_i - y_{i-1}| ~ |N(0, 2 sigma^2)|: median = 0.6745 * sqrt(2) * sigma.
  const double sigma = Median(values, scratch_) / (0.6745 * std::sqrt(2.0));
  return std::max(sigma, options_.noise_floor);
}

void FailSlowDetector::Warm() {
  std::vector<Sample> initial(kept_.begin(), kept_.end());
  kept_.clear();
  abs_diffs_.clear();
  for (std::size_t i = 1; i < initial.size(); ++i) {
    abs_diffs_.push_back(std::fabs(initial[i].y - initial[i - 1].y));
  }
  std::vector<double> ys;
  for (const Sample& s : initial) {
    ys.push_back(s.y);
  }
  baseline_ = Median(ys, scratch_);
  baseline_n_ = 1;
  warm_ = true;
  regime_kept_ = 0;
  for (const Sample& s : initial) {  // warm-up samples seed BOCD; no alarms from them
    if (options_.verify) {
      const double sigma = Sigma();
      if (std::fabs(s.y - baseline_) > options_.outlier_z * sigma) {
        continue;
      }
    }
    (void)Feed(s, s.index);  // result ignored: no alarm may come from warm-up data
  }
}

DetectorStep FailSlowDetector::Push(double seconds) {
  DetectorStep step;
  const std::uint64_t index = next_index_++;
  if (!(seconds > 0.0) || !std::isfinite(seconds)) {
    step.status = SampleStatus::kInvalid;
    return step;
  }
  const Sample sample{index, std::log(seconds)};
  if (!warm_) {
    kept_.push_back(sample);
    if (kept_.size() >= options_.warmup) {
      Warm();
    }
    return step;
  }
  if (!options_.verify) {
    step.alarm = Feed(sample, index);
    return step;
  }
  const double band = options_.outlier_z * Sigma();
  const bool near_level = std::fabs(sample.y - Level()) <= band;
  const bool near_released = released_level_ && std::fabs(sample.y - *released_level_) <= band;
  if (near_level) {
    released_level_.reset();  // back at the current level: any released run was transient
  }
  if (near_level || near_released) {
    pending_.clear();  // a short suspect run followed by a normal sample: spikes, dropped
    step.alarm = Feed(sample, index);
    return step;
  }
  pending_.push_back(sample);
  if (pending_.size() <= options_.max_outlier_run) {
    return step;
  }
  // Persistent: a real change. Release in order, then verify once with all the evidence (an
  // intermediate verdict would ignore samples already seen). Later samples near the released
  // run are not held again while verification waits for more of them.
  scratch2_.clear();
  for (const Sample& s : pending_) {
    Absorb(s);
    scratch2_.push_back(s.y);
  }
  std::vector<double> released(scratch2_);
  released_level_ = Median(released, scratch_);
  pending_.clear();
  step.alarm = Verify(index);
  return step;
}

std::optional<Alarm> FailSlowDetector::Feed(const Sample& s, std::uint64_t at) {
  Absorb(s);
  return Verify(at);
}

void FailSlowDetector::Absorb(const Sample& s) {
  if (!kept_.empty()) {
    abs_diffs_.push_back(std::fabs(s.y - kept_.back().y));
    if (abs_diffs_.size() > kDiffs) {
      abs_diffs_.pop_front();
    }
  }
  const double sigma = Sigma();
  if (kept_.size() >= 2) {  // s is not in kept_ yet: back() is t-1, the one before is t-2
    // Each difference is clipped at about 3 of its own standard deviations (E|d| = 0.8 sd for
    // normal noise), so a step or a spike that got through moves neither mean much.
    const double d1 = std::fabs(s.y - kept_.back().y);
    const double d2 = std::fabs(s.y - kept_[kept_.size() - 2].y);
    lag_n_ = std::min<std::uint64_t>(lag_n_ + 1, options_.baseline_horizon);
    const double w = 1.0 / static_cast<double>(lag_n_);
    const bool seeded = lag_n_ > 8;
    lag1_ += w * ((seeded ? std::min(d1, kLagClip * lag1_) : d1) - lag1_);
    lag2_ += w * ((seeded ? std::min(d2, kLagClip * lag2_) : d2) - lag2_);
  }
  NormalGammaPrior prior;
  prior.mu = kept_.empty() ? s.y : Level();
  prior.alpha = 2.0;
  prior.beta = sigma * sigma;  // prior mean variance beta / (alpha - 1) = sigma^2
  prior.kappa = 0.05;
  bocd_.SetPrior(prior);
  bocd_.Update(s.y);
  kept_.push_back(s);
  if (kept_.size() > kHistory) {
    kept_.pop_front();
  }
  ++regime_kept_;
  if (warm_) {
    UpdateBaseline(s.y, sigma);
  }
}

std::optional<Alarm> FailSlowDetector::Verify(std::uint64_t at) {
  if (regime_kept_ < options_.min_post + 1) {
    return std::nullopt;
  }
  const std::uint64_t limit = std::min<std::uint64_t>(options_.window, regime_kept_);
  const double probability = bocd_.ProbRunShorterThan(limit);
  if (probability <= options_.cp_threshold) {
    return std::nullopt;
  }
  const std::uint64_t run = bocd_.MapRunLengthBelow(limit);
  if (run < options_.min_post || run >= limit || run > kept_.size()) {
    return std::nullopt;
  }
  std::size_t first_post = kept_.size() - static_cast<std::size_t>(run);
  const std::size_t pre_count = static_cast<std::size_t>(
      std::min<std::uint64_t>({regime_kept_ - run, kPreSamples, first_post}));
  if (pre_count == 0) {
    return std::nullopt;
  }
  std::vector<double> pre, post;
  for (std::size_t i = first_post - pre_count; i < first_post; ++i) {
    pre.push_back(kept_[i].y);
  }
  const double pre_level = Median(pre, scratch_);
  // Onset refinement: with a handful of samples the MAP run length is often one too long; a
  // leading sample nearer the old level than the new one belongs before the change.
  for (std::size_t i = first_post + 1; i < kept_.size(); ++i) {
    post.push_back(kept_[i].y);
  }
  while (post.size() >= options_.min_post) {
    const double rest = Median(post, scratch_);
    const double lead = kept_[first_post].y;
    if (std::fabs(lead - pre_level) >= std::fabs(lead - rest)) {
      break;
    }
    ++first_post;
    post.erase(post.begin());
  }
  post.insert(post.begin(), kept_[first_post].y);
  const double post_level = Median(post, scratch_);
  if (options_.verify && options_.level_spread_z > 0.0 && post_level > pre_level &&
      LevelSpread(post, scratch_) > options_.level_spread_z * Sigma()) {
    return std::nullopt;  // not (yet) one level: a burst of spikes of varying size, wait it out
  }
  return Decide(at, kept_[first_post].index, post_level, pre_level, probability);
}

std::optional<Alarm> FailSlowDetector::Decide(std::uint64_t at, std::uint64_t onset, double post,
                                              double pre, double probability) {
  Alarm alarm{AlarmType::kSlow, at, onset, std::exp(post - baseline_), probability,
              std::exp(post)};
  const auto first = std::find_if(kept_.begin(), kept_.end(),
                                  [&](const Sample& s) { return s.index >= onset; });
  const auto run = static_cast<std::uint64_t>(kept_.end() - first);
  if (!options_.verify) {  // plain BOCD: every change point is an alarm
    regime_kept_ = run;
    released_level_.reset();
    alarm.type = post > pre ? AlarmType::kSlow : AlarmType::kRecovered;
    slow_ = post > baseline_;
    return alarm;
  }
  const double margin = options_.confidence_z * 1.2533 * Sigma() * margin_factor() /
                        std::sqrt(static_cast<double>(std::max<std::uint64_t>(run, 1)));
  const double threshold = std::log1p(options_.min_change) + margin;
  const double reference = slow_ ? slow_level_ : baseline_;
  if (post - reference > threshold) {  // onset of a fail-slow, or a further step of a ladder
    regime_kept_ = run;
    released_level_.reset();
    slow_ = true;
    slow_level_ = post;
    return alarm;
  }
  if (slow_ && post - baseline_ < std::log1p(options_.min_change) - margin) {
    regime_kept_ = run;
    released_level_.reset();
    slow_ = false;
    alarm.type = AlarmType::kRecovered;
    return alarm;
  }
  if (slow_ && slow_level_ - post > threshold) {
    regime_kept_ = run;
    released_level_.reset();
    slow_level_ = post;  // eased but still slow: the new reference for further steps
  }
  return std::nullopt;
}

double FailSlowDetector::noise_autocorrelation() const {
  if (lag_n_ < 32 || lag1_ <= 0.0) {
    return 0.0;
  }
  const double ratio = lag2_ / lag1_;  // sqrt(1 + rho) for AR(1) noise
  return std::clamp(ratio * ratio - 1.0, -1.0, 1.0);
}

double FailSlowDetector::margin_factor() const {  // the long-run factor, >= 1
  if (options_.rho_floor >= 1.0) {
    return 1.0;
  }
  const double estimate = noise_autocorrelation();
  const double rho = estimate > options_.rho_floor ? std::min(estimate, 0.9) : 0.0;
  return std::sqrt(1.0 + rho) / (1.0 - rho);
}

void FailSlowDetector::UpdateBaseline(double y, double sigma) {
  if (slow_) {
    return;
  }
  baseline_n_ = std::min<std::uint64_t>(baseline_n_ + 1, options_.baseline_horizon);
  // A running mean whose upward pulls are clipped (one-sided Huber): a slow sample raises the
  // baseline by at most baseline_clip_z noise sigmas' worth, so a burst of host noise inside the
  // healthy period cannot lift the level a later fail-slow is judged against; drift within the
  // noise is followed as by a plain mean, and so is a job that becomes faster (the end of a slow
  // warm-up), which a two-sided clip would follow only over thousands of iterations.
  double step = y - baseline_;
  if (options_.baseline_clip_z > 0.0) {
    step = std::min(step, options_.baseline_clip_z * sigma);
  }
  baseline_ += step / static_cast<double>(baseline_n_);
}

}  // namespace falcon::analyzer
