// BOCD with Normal-Gamma model. See bocd.h for the contract.
//
// Update(x) for each kept run length i (posterior N-G parameters mu, kappa, alpha, beta):
//   predictive  x ~ Student-t(nu = 2 alpha, mu, s^2 = beta (kappa + 1) / (alpha kappa)),
//   growth      log_mass_i += log pred_i + log(1 - H),
//   change      new run (length 0) gets log(sum_i mass_i pred_i) + log H,
// then the parameters absorb x and the masses are renormalised. lgamma(alpha + 1/2) - lgamma(alpha)
// is carried per hypothesis by the recurrence D(alpha + 1/2) = log(alpha) - D(alpha), so a step
// needs no lgamma.
#include "analyzer/bocd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace falcon::analyzer {

Bocd::Bocd(const BocdOptions& options, const NormalGammaPrior& prior)
    : options_(options), prior_(prior) {
  options_.max_hypotheses = std::max<std::size_t>(options_.max_hypotheses, 2);
  const std::size_t cap = options_.max_hypotheses * 2 + 2;
  for (auto* v : {&log_mass_, &mu_, &kappa_, &alpha_, &beta_, &lgamma_diff_, &scratch_}) {
    v->reserve(cap);
  }
  run_.reserve(cap);
  BuildTable();
}

void Bocd::BuildTable() {
  table_alpha0_ = prior_.alpha;
  for (std::size_t n = 0; n < kTable; ++n) {
    const double a = prior_.alpha + 0.5 * static_cast<double>(n);
    table_[n] = std::lgamma(a + 0.5) - std::lgamma(a);
  }
}

void Bocd::SetPrior(const NormalGammaPrior& prior) {
  prior_ = prior;
  if (prior_.alpha != table_alpha0_) {
    BuildTable();
  }
}

double Bocd::Update(double x) {
  const double log_h = std::log(options_.hazard);
  const double log_1mh = std::log1p(-options_.hazard);
  const double half_log_2pi = 0.5 * std::log(2.0 * std::numbers::pi);
  // Prior hypothesis (run about to start) is appended first so that it is scored like the others.
  run_.push_back(0);
  log_mass_.push_back(0.0);  // placeholder, set below
  mu_.push_back(prior_.mu);
  kappa_.push_back(prior_.kappa);
  alpha_.push_back(prior_.alpha);
  beta_.push_back(prior_.beta);
  lgamma_diff_.push_back(table_[0]);
  const std::size_t n = run_.size();
  const std::size_t fresh = n - 1;
  double change_max = -std::numeric_limits<double>::infinity();
  scratch_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double k = kappa_[i];
    const double a = alpha_[i];
    const double scale2 = 2.0 * beta_[i] * (k + 1.0) / k;  // nu * s^2
    const double d = x - mu_[i];
    const double lp = lgamma_diff_[i] - half_log_2pi - 0.5 * std::log(0.5 * scale2) -
                      (a + 0.5) * std::log(1.0 + d * d / scale2);
    scratch_[i] = lp;
    // Update sufficient statistics with x.
    mu_[i] = (k * mu_[i] + x) / (k + 1.0);
    beta_[i] += 0.5 * k * d * d / (k + 1.0);
    kappa_[i] = k + 1.0;
    const std::uint64_t seen = run_[i];  // observations before x (0 for the fresh hypothesis)
    if (seen + 1 < kTable && a - 0.5 * static_cast<double>(seen) == table_alpha0_) {
      lgamma_diff_[i] = table_[seen + 1];
    } else {
      lgamma_diff_[i] = std::log(a) - lgamma_diff_[i];
    }
    alpha_[i] = a + 0.5;
    if (i != fresh) {
      const double joint = log_mass_[i] + lp;
      change_max = std::max(change_max, joint);
    }
  }
  double change_sum = 0.0;
  for (std::size_t i = 0; i < fresh; ++i) {
    change_sum += std::exp(log_mass_[i] + scratch_[i] - change_max);
  }
  // Evidence p(x | past) = sum_i mass_i pred_i; growth takes (1 - H) of it and change H, so the
  // normaliser is the evidence itself and needs no second pass of exponentials.
  const double log_evidence = fresh == 0 ? scratch_[0] : change_max + std::log(change_sum);
  for (std::size_t i = 0; i < fresh; ++i) {
    log_mass_[i] += scratch_[i] + log_1mh - log_evidence;
    ++run_[i];
  }
  // The fresh hypothesis has seen x: it is the run of length 1 that started at this observation.
  log_mass_[fresh] = fresh == 0 ? 0.0 : log_h;
  run_[fresh] = 1;
  ++steps_;
  Prune();
  return log_evidence;
}

void Bocd::Prune() {
  // Amortised: prune back to max_hypotheses once the set exceeds it by a quarter.
  const std::size_t n = run_.size();
  if (n <= options_.max_hypotheses + options_.max_hypotheses / 4) {
    return;
  }
  // Candidates are all but the newest run (length 1), which is always kept.
  const double top = *std::max_element(log_mass_.begin(), log_mass_.end());
  scratch_.assign(log_mass_.begin(), log_mass_.end() - 1);
  const std::size_t drop = n - options_.max_hypotheses;
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(drop - 1),
                   scratch_.end());
  const double cutoff = std::max(scratch_[drop - 1], top + options_.prune_log_ratio);
  std::size_t out = 0;
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool below = log_mass_[i] < cutoff || (log_mass_[i] == cutoff && dropped < drop);
    if (below && i + 1 != n) {
      ++dropped;
      continue;
    }
    run_[out] = run_[i];
    log_mass_[out] = log_mass_[i];
    mu_[out] = mu_[i];
    kappa_[out] = kappa_[i];
    alpha_[out] = alpha_[i];
    beta_[out] = beta_[i];
    lgamma_diff_[out] = lgamma_diff_[i];
    ++out;
  }
  for (auto* v : {&log_mass_, &mu_, &kappa_, &alpha_, &beta_, &lgamma_diff_}) {
    v->resize(out);
  }
  run_.resize(out);
}

double Bocd::ProbRunShorterThan(std::uint64_t r) const {
  double p = 0.0;
  for (std::size_t i = 0; i < run_.size(); ++i) {
    if (run_[i] < r) {
      p += std::exp(log_mass_[i]);
    }
  }
  return p;
}

std::uint64_t Bocd::MapRunLengthBelow(std::uint64_t r) const {
  std::uint64_t best = r;
  double best_mass = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < run_.size(); ++i) {
    if (run_[i] < r && log_mass_[i] > best_mass) {
      best_mass = log_mass_[i];
      best = run_[i];
    }
  }
  return best;
}

std::size_t Bocd::MemoryBytes() const {
  return run_.capacity() * sizeof(std::uint64_t) +
         (log_mass_.capacity() + mu_.capacity() + kappa_.capacity() + alpha_.capacity() +
          beta_.capacity() + lgamma_diff_.capacity() + scratch_.capacity()) *
             sizeof(double);
}

}  // namespace falcon::analyzer
