// The trainer's models: modelled compute time (sleeps scaled by the fault plan's compute factor)
// and the predictable payloads that --check fills into buffers and verifies after every
// collective and receive.
//
// Payloads are small integers (0..250) stored as float32, so sums over any realistic group size
// are exact; every element depends on a key (what the buffer is, which iteration, micro-batch,
// layer and sender) and on its index, so data from another iteration, micro-batch or sender, a
// lost chunk or a shifted copy all fail verification. The weighted DP gradient is the one inexact
// case: it is checked against the same float computation within a relative 1e-5.
//
// Thread-safety: the pure functions are safe anywhere; a ComputeModel is used by one thread.
// Must never: spin (compute is clock_nanosleep to an absolute CLOCK_MONOTONIC deadline: 16 ranks
// share 2 cores), or call NCCL.
#ifndef FALCON_BENCH_TRAIN_MODEL_H_
#define FALCON_BENCH_TRAIN_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace falcon::train {

// --- Compute --------------------------------------------------------------------------------

// Seconds since the job epoch at which a compute phase starts -> slowdown factor (>= 1).
using ComputeFactorFn = std::function<double(double job_s)>;
// Seconds since the job epoch.
using JobClockFn = std::function<double()>;

class ComputeModel {
 public:
  ComputeModel(ComputeFactorFn factor, JobClockFn clock) : factor_(std::move(factor)), clock_(std::move(clock)) {}

  // Sleeps for base_ms times the factor in force when the phase starts (sampled once per phase).
  // Returns the factor used.
  double Run(double base_ms);
  // Samples the factor in force now into TakeMaxFactor's record without sleeping (compute that
  // the emulated device runs and slows itself). Returns it.
  double Observe();

  // Largest factor used since the last call (1 when none); resets it.
  double TakeMaxFactor();

 private:
  ComputeFactorFn factor_;
  JobClockFn clock_;
  double max_factor_ = 1;
};

// Sleeps until now + seconds (CLOCK_MONOTONIC, absolute deadline, restarted on EINTR).
void SleepFor(double seconds);
// CLOCK_MONOTONIC in seconds.
[[nodiscard]] double MonotonicSeconds();

// --- Payloads -------------------------------------------------------------------------------

// What a buffer carries; part of every payload key.
enum class PayloadTag : std::int64_t { kActivation = 1, kActivationGrad, kTpForward, kTpBackward, kDpGrad, kEmbeddingGrad };

// A 64-bit key over the fields (FNV-1a style mixing of each value).
[[nodiscard]] std::uint64_t PayloadKey(PayloadTag tag, std::initializer_list<std::int64_t> fields);

// Element i of the payload with `key`: an integer in [0, 251).
[[nodiscard]] inline float PayloadValue(std::uint64_t key, std::size_t i) {
  return static_cast<float>((key % 251 + (i % 251) * 7) % 251);
}

void FillPayload(std::span<float> buf, std::uint64_t key);
// buf[i] += PayloadValue(key, i) for every i.
void AddPayload(std::span<float> buf, std::uint64_t key);

struct Mismatch {
  std::size_t index = 0;
  float got = 0;
  float expected = 0;
};

// Compares a strided sample of `buf` with expect(i): about 4096 elements (all of a small buffer),
// starting at `rotation` % stride so successive iterations cover every element, plus the last.
// Equality is exact when rel_tolerance == 0, else |got - expected| <= rel_tolerance * max(1,
// |expected|). Returns the first mismatch.
[[nodiscard]] std::optional<Mismatch> VerifySample(std::span<const float> buf,
                                                   const std::function<float(std::size_t)>& expect,
                                                   std::uint64_t rotation, double rel_tolerance);

// The DP gradient of one replica for one iteration before weighting: the sum over its
// micro-batches 0..m-1 of PayloadValue(key_of_mb(mb), i).
using GradKeyFn = std::function<std::uint64_t(int mb)>;
[[nodiscard]] float GradValue(const GradKeyFn& key_of_mb, int micro_batches, std::size_t i);

// Weight of a replica with m micro-batches in a weighted DP all-reduce: m / sum(m), so the summed
// gradient is the mean over all samples whatever the split (unbiased under a micro-batch plan).
[[nodiscard]] float ReplicaWeight(int m, const std::vector<int>& all_m);

// Expected element i after the weighted DP sum: fold over replicas d = 0..n-1 in order (as the
// emulator reduces) of float(GradValue_d(i) * weight_d).
[[nodiscard]] float WeightedGradSum(const std::vector<GradKeyFn>& key_of_mb_per_replica,
                                    const std::vector<int>& all_m, std::size_t i);

// "what: element i = got, expected e" for error messages.
[[nodiscard]] std::string DescribeMismatch(const std::string& what, const Mismatch& m);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_MODEL_H_
