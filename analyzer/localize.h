// Localisation (FALCON §4.3): from the results of a validation round (GEMM on suspect GPUs, P2P
// passes over suspicious groups' links) to the slow GPUs, slow links and slow NICs, each with
// its evidence. A result stands out against robust baselines:
//  - GPU: GEMM median > gemm_ratio x median of all GEMM results (own and peers'), by more than
//    mad_z robust sigmas (1.4826 MAD of the baseline's inliers: values <= ratio x median) and
//    more than min_margin_s seconds.
//  - Link: seconds per byte > link_ratio x the median of its pass and x the median of all passes
//    (each by more than mad_z robust sigmas; in seconds by more than min_margin_s). Baselines are
//    kept apart by link kind (intra-node, inter-node, unknown nodes) since NVLink and the network
//    differ by an order of magnitude. A pass with fewer than min_baseline transfers (tiny
//    groups) is judged against all passes only. Measurements of the same rank pair (ring and
//    tree) merge into one finding.
//  - NIC: a node whose slow inter-node links reach at least nic_min_links distinct peer nodes
//    and at least nic_min_fraction of the peer nodes it was tested with. The links it explains
//    are reported under the NIC, not as links.
//  - A slow link with a slow GPU at one end, no slower than that GPU's GEMM, is explained by the
//    GPU: NCCL moves P2P data with kernels on the GPU's SMs, so a throttled GPU sends and
//    receives slowly too. It is reported under the GPU, not as a link (nor counted for a NIC).
//  Peers' results (the same plan or GEMM on healthy groups of the class) widen the baselines:
//  that is how a 2-rank group gets a baseline. Their transfers are judged too: a link the
//  profile did not single out (its group waited on other things) is still slow when measured
//  slow. Peers' GEMMs only widen the baseline. A baseline needs values from
//  min_baseline distinct sources (GPUs; rank pairs for links); otherwise the result is not judged
//  and is counted as unassessed. No finding at all means the
//  suspicion was a false alarm (or unassessable: see the counts).
// Everything is a ratio against medians, so the answer does not depend on units, except
// min_margin_s (an absolute floor against timer resolution).
// Thread-safety: stateless functions; safe from any thread.
// Must never: do I/O, read clocks or globals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "falcon/status.h"

namespace falcon::analyzer {

// One P2P transfer of a validation pass, as measured by the executor (FalconTaskResult).
struct TransferMeasurement {
  std::uint32_t pass = 0;  // index of the pass in its plan (ring and tree: use distinct ranges)
  std::int32_t sender = -1;  // ranks in one numbering for the whole input (global ranks)
  std::int32_t receiver = -1;
  std::int32_t sender_node = -1;  // node index; -1 = unknown
  std::int32_t receiver_node = -1;
  double median_s = 0.0;  // median transfer time, seconds (finite, > 0)
  std::uint64_t bytes = 0;  // > 0
};

struct GemmMeasurement {
  std::int32_t rank = -1;
  std::int32_t node = -1;
  double median_s = 0.0;  // finite, > 0
};

struct LocalizationInput {
  std::span<const TransferMeasurement> transfers;       // the suspicious group(s)
  std::span<const TransferMeasurement> peer_transfers;  // healthy peers: baseline, judged too
  std::span<const GemmMeasurement> gemms;
  std::span<const GemmMeasurement> peer_gemms;
};

struct LocalizationOptions {
  // 1.2: healthy GEMM and P2P times of one class vary by a few per cent (clocks, thermals, the
  // fabric), so 1.2 sits several noise widths above them; fail-slows worth mitigating are
  // 1.3x-10x. A 10 % iteration slowdown from one GPU that is only 1.1-1.2x slow is missed:
  // lower it where validation noise is known to be < 2 %.
  double gemm_ratio = 1.2;
  double link_ratio = 1.2;
  // The excess must also exceed this many robust sigmas: ~3e-7 false findings per healthy value
  // under Gaussian noise, whatever its width.
  double mad_z = 5.0;
  double min_margin_s = 20e-6;  // ... and this many seconds (timer resolution, launch jitter)
  // Distinct sources a baseline needs (own + peers): GPUs for GEMM, rank pairs for links (ring
  // and tree measurements of one pair count once).
  std::size_t min_baseline = 3;
  std::size_t nic_min_links = 2;
  double nic_min_fraction = 0.5;
};

// Why a result was reported: measured against what.
struct Evidence {
  double measured = 0.0;  // GEMM: seconds; link: seconds per byte
  double baseline = 0.0;  // the median it was compared with (same unit)
  double ratio = 0.0;     // measured / baseline
  double sigma = 0.0;     // robust sigma of the baseline's inliers (same unit)
  std::size_t baseline_count = 0;  // values behind the median (from >= min_baseline sources)
};

struct SlowLink {
  std::int32_t sender = -1, receiver = -1;  // of the worst measurement
  std::int32_t sender_node = -1, receiver_node = -1;
  std::uint32_t pass = 0;
  std::size_t measurements = 0;  // slow measurements of this rank pair merged here
  Evidence evidence;             // against all passes (worst measurement)
  Evidence pass_evidence;        // against its pass; baseline_count 0 when the pass was too small
};

struct SlowGpu {
  std::int32_t rank = -1;
  std::int32_t node = -1;
  Evidence evidence;
  std::vector<SlowLink> links;  // slow links it explains (it is at one end, they are no slower)
};

struct SlowNic {
  std::int32_t node = -1;
  std::size_t slow_peer_nodes = 0;    // distinct nodes reached by its slow links
  std::size_t tested_peer_nodes = 0;  // distinct nodes it was tested with
  Evidence evidence;                  // median over its slow links' measured vs baseline
  std::vector<SlowLink> links;        // the slow links it explains
};

struct Localization {
  std::vector<SlowGpu> gpus;    // by rank
  std::vector<SlowLink> links;  // links not explained by a GPU or NIC, by (sender, receiver)
  std::vector<SlowNic> nics;    // by node
  std::size_t gemms_unassessed = 0;      // too few GEMM results for a baseline
  std::size_t transfers_unassessed = 0;  // too few transfers of their kind for a baseline
  [[nodiscard]] bool nothing_found() const { return gpus.empty() && links.empty() && nics.empty(); }
};

// InvalidArgument for a non-finite or non-positive time, zero bytes, a transfer from a rank to
// itself, ratios below 1, or min_baseline < 2.
[[nodiscard]] Result<Localization> Localize(const LocalizationInput& input,
                                            const LocalizationOptions& options = {});

}  // namespace falcon::analyzer
