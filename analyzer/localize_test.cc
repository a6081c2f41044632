// Tests for localisation on seeded randomised validation rounds: a group's ring and tree passes
// (validation_plan.h) with noisy healthy times and one injected fault (slow GPU, slow link
// between two nodes, slow NIC of a node). Every trial must report exactly the injected fault,
// and nothing on healthy data; answers do not depend on the time unit.
#include "analyzer/localize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "analyzer/test_util.h"
#include "analyzer/validation_plan.h"

namespace falcon::analyzer {
namespace {

constexpr std::uint64_t kBytes = std::uint64_t{64} << 20;
constexpr std::uint32_t kTreePassBase = 10;  // tree passes are numbered 10..13

enum class Fault { kNone, kGpu, kLink, kNic };

using NodePair = std::pair<std::int32_t, std::int32_t>;
NodePair Unordered(std::int32_t a, std::int32_t b) { return {std::min(a, b), std::max(a, b)}; }

struct Round {
  std::vector<TransferMeasurement> transfers;
  std::vector<GemmMeasurement> gemms;
  // The injected fault: rank (GPU), node pair (link) or node (NIC).
  std::int32_t gpu = -1, nic = -1;
  std::pair<std::int32_t, std::int32_t> link{-1, -1};
};

struct RoundSpec {
  std::size_t n = 8;
  std::size_t ranks_per_node = 1;
  Fault fault = Fault::kNone;
  double factor = 2.0;
  double cov = 0.03;   // healthy noise (coefficient of variation)
  double scale = 1.0;  // unit of time: 1 = seconds, 1e-6 turns seconds into microseconds' size
  std::int32_t first_rank = 0;  // numbering offset (peer groups use other ranks and nodes)
};

Round MakeRound(const RoundSpec& spec, testing::Rng& rng) {
  Round round;
  const auto node = [&](std::int32_t r) {
    return (r - spec.first_rank) / static_cast<std::int32_t>(spec.ranks_per_node) +
           spec.first_rank;
  };
  const std::int32_t nodes = static_cast<std::int32_t>(spec.n / spec.ranks_per_node);
  const auto noise = [&] { return std::exp(spec.cov * rng.Gauss()); };
  // Fault placement: a random rank; a random inter-node ring link; a random node.
  const std::int32_t pick = static_cast<std::int32_t>(rng.Next() % spec.n);
  if (spec.fault == Fault::kGpu) round.gpu = spec.first_rank + pick;
  if (spec.fault == Fault::kNic) round.nic = spec.first_rank + pick % nodes;
  if (spec.fault == Fault::kLink) {
    std::int32_t r = pick;  // walk to a ring link that crosses nodes
    while (node(spec.first_rank + r) ==
           node(spec.first_rank + (r + 1) % static_cast<std::int32_t>(spec.n))) {
      r = (r + 1) % static_cast<std::int32_t>(spec.n);
    }
    round.link = Unordered(node(spec.first_rank + r),
                             node(spec.first_rank + (r + 1) % static_cast<std::int32_t>(spec.n)));
  }
  const auto add_plan = [&](const ValidationPlan& plan, std::uint32_t pass_base) {
    for (std::size_t p = 0; p < plan.passes.size(); ++p) {
      for (const PlannedTransfer& t : plan.passes[p].transfers) {
        TransferMeasurement m;
        m.pass = pass_base + static_cast<std::uint32_t>(p);
        m.sender = spec.first_rank + t.sender;
        m.receiver = spec.first_rank + t.receiver;
        m.sender_node = node(m.sender);
        m.receiver_node = node(m.receiver);
        m.bytes = kBytes;
        const bool intra = m.sender_node == m.receiver_node;
        double s = static_cast<double>(kBytes) / (intra ? 100e9 : 10e9) * noise();
        const auto nodes_pair = Unordered(m.sender_node, m.receiver_node);
        if (!intra && (nodes_pair == round.link || m.sender_node == round.nic ||
                       m.receiver_node == round.nic)) {
          s *= spec.factor;
        }
        m.median_s = s * spec.scale;
        round.transfers.push_back(m);
      }
    }
  };
  add_plan(PlanRing(spec.n).value(), 0);
  add_plan(PlanTree(spec.n).value(), kTreePassBase);
  for (std::size_t r = 0; r < spec.n; ++r) {
    const std::int32_t rank = spec.first_rank + static_cast<std::int32_t>(r);
    const double s = 0.05 * noise() * (rank == round.gpu ? spec.factor : 1.0);
    round.gemms.push_back({rank, node(rank), s * spec.scale});
  }
  return round;
}

// Checks the localisation names exactly the injected fault; returns a description on mismatch.
std::string Mismatch(const Localization& loc, const Round& round) {
  std::set<std::int32_t> gpus, nics;
  std::set<std::pair<std::int32_t, std::int32_t>> links;
  for (const SlowGpu& g : loc.gpus) gpus.insert(g.rank);
  for (const SlowNic& n : loc.nics) nics.insert(n.node);
  for (const SlowLink& l : loc.links) links.insert(Unordered(l.sender_node, l.receiver_node));
  const std::set<std::int32_t> want_gpus =
      round.gpu >= 0 ? std::set<std::int32_t>{round.gpu} : std::set<std::int32_t>{};
  const std::set<std::int32_t> want_nics =
      round.nic >= 0 ? std::set<std::int32_t>{round.nic} : std::set<std::int32_t>{};
  std::set<std::pair<std::int32_t, std::int32_t>> want_links;
  if (round.link.first >= 0) want_links.insert(round.link);
  std::string out;
  if (gpus != want_gpus) out += " gpus(" + std::to_string(gpus.size()) + ")";
  if (nics != want_nics) out += " nics(" + std::to_string(nics.size()) + ")";
  if (links != want_links) out += " links(" + std::to_string(links.size()) + ")";
  return out;
}

TEST(LocalizeTest, FindsExactlyTheInjectedFaultUnderNoise) {
  struct Case {
    const char* what;
    Fault fault;
    std::size_t min_n, max_n, ranks_per_node;
  };
  const Case cases[] = {
      {"healthy", Fault::kNone, 2, 32, 1},
      {"slow GPU", Fault::kGpu, 3, 32, 1},
      {"slow link", Fault::kLink, 3, 32, 1},
      {"slow NIC", Fault::kNic, 8, 32, 1},
      {"slow link, 2 ranks per node", Fault::kLink, 6, 32, 2},  // 4: every inter link is slow
      {"slow NIC, 2 ranks per node", Fault::kNic, 16, 32, 2},
      {"slow NIC, small groups", Fault::kNic, 6, 12, 1},
  };
  for (const Case& c : cases) {
    int exact = 0;
    const int trials = 200;
    for (int trial = 0; trial < trials; ++trial) {
      testing::Rng rng(static_cast<std::uint64_t>(trial) * 7919 + static_cast<std::uint64_t>(c.fault));
      RoundSpec spec;
      spec.fault = c.fault;
      spec.ranks_per_node = c.ranks_per_node;
      spec.n = c.min_n + rng.Next() % (c.max_n - c.min_n + 1);
      spec.n -= spec.n % c.ranks_per_node;
      spec.factor = 1.5 + 1.5 * rng.Uniform();
      const Round round = MakeRound(spec, rng);
      const Result<Localization> loc = Localize({round.transfers, {}, round.gemms, {}});
      ASSERT_TRUE(loc.ok()) << loc.status().ToString();
      const std::string mismatch = Mismatch(loc.value(), round);
      EXPECT_EQ(mismatch, "") << c.what << " trial " << trial << " n " << spec.n << " x"
                              << spec.factor;
      exact += mismatch.empty() ? 1 : 0;
    }
    EXPECT_EQ(exact, trials) << c.what;
  }
}

TEST(LocalizeTest, EvidenceCarriesMeasuredMedianAndRatio) {
  testing::Rng rng(5);
  RoundSpec spec;
  spec.fault = Fault::kNic;
  spec.n = 16;
  spec.factor = 2.5;
  spec.cov = 0.0;  // exact ratios
  const Round round = MakeRound(spec, rng);
  const Localization loc = Localize({round.transfers, {}, round.gemms, {}}).value();
  ASSERT_EQ(loc.nics.size(), 1U);
  const SlowNic& nic = loc.nics[0];
  EXPECT_EQ(nic.node, round.nic);
  EXPECT_DOUBLE_EQ(nic.evidence.ratio, 2.5);
  EXPECT_DOUBLE_EQ(nic.evidence.baseline, 1.0 / 10e9);
  EXPECT_EQ(nic.slow_peer_nodes, nic.tested_peer_nodes);
  EXPECT_GE(nic.links.size(), 2U);
  for (const SlowLink& l : nic.links) {
    EXPECT_TRUE(l.sender_node == round.nic || l.receiver_node == round.nic);
    EXPECT_DOUBLE_EQ(l.evidence.measured, 2.5 / 10e9);
  }
  EXPECT_TRUE(loc.links.empty());
  EXPECT_TRUE(loc.gpus.empty());
}

TEST(LocalizeTest, TinyGroupsNeedTheirClassPeers) {
  for (const Fault fault : {Fault::kLink, Fault::kGpu}) {
    for (int trial = 0; trial < 200; ++trial) {
      testing::Rng rng(static_cast<std::uint64_t>(trial) + 100);
      RoundSpec spec;
      spec.n = 2;
      spec.fault = fault;
      spec.factor = 1.5 + 1.5 * rng.Uniform();
      const Round own = MakeRound(spec, rng);
      // Alone: no baseline, nothing judged, nothing found.
      const Localization alone = Localize({own.transfers, {}, own.gemms, {}}).value();
      EXPECT_TRUE(alone.nothing_found());
      EXPECT_EQ(alone.transfers_unassessed, own.transfers.size());
      EXPECT_EQ(alone.gemms_unassessed, 2U);
      // With three healthy pairs of the class (other ranks, other nodes): found.
      std::vector<TransferMeasurement> peer_transfers;
      std::vector<GemmMeasurement> peer_gemms;
      for (std::int32_t g = 1; g <= 3; ++g) {
        RoundSpec peer;
        peer.n = 2;
        peer.first_rank = 100 * g;
        const Round r = MakeRound(peer, rng);
        peer_transfers.insert(peer_transfers.end(), r.transfers.begin(), r.transfers.end());
        peer_gemms.insert(peer_gemms.end(), r.gemms.begin(), r.gemms.end());
      }
      const Localization loc =
          Localize({own.transfers, peer_transfers, own.gemms, peer_gemms}).value();
      EXPECT_EQ(Mismatch(loc, own), "") << "trial " << trial;
      EXPECT_EQ(loc.transfers_unassessed, 0U);
    }
  }
}

// The profile singled out one group, but the slow link lies in a peer group of its class (its
// group's collective time hid it behind waits): measured slow, it is named all the same.
TEST(LocalizeTest, ASlowLinkInAPeerGroupIsNamed) {
  for (int trial = 0; trial < 100; ++trial) {
    testing::Rng rng(static_cast<std::uint64_t>(trial) + 7000);
    RoundSpec own_spec;
    own_spec.n = 4;
    const Round own = MakeRound(own_spec, rng);
    RoundSpec peer_spec = own_spec;
    peer_spec.first_rank = 100;
    peer_spec.fault = Fault::kLink;
    peer_spec.factor = 1.6 + rng.Uniform();
    const Round peer = MakeRound(peer_spec, rng);
    const Localization loc = Localize({own.transfers, peer.transfers, own.gemms, {}}).value();
    ASSERT_EQ(loc.links.size(), 1u) << "trial " << trial;
    EXPECT_EQ(Unordered(loc.links[0].sender_node, loc.links[0].receiver_node), peer.link) << "trial " << trial;
    EXPECT_TRUE(loc.nics.empty() && loc.gpus.empty()) << "trial " << trial;
  }
}

TEST(LocalizeTest, ScaleFree) {
  // Same rounds in seconds, milliseconds' and microseconds' magnitude: the same findings with
  // the absolute margin off; with the default 20 us margin, identical for second- and
  // millisecond-sized times, and microsecond-sized differences are (by design) below it.
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<std::string> answers;
    for (const double scale : {1.0, 1e-3, 1e-6, 1e3}) {
      testing::Rng rng(static_cast<std::uint64_t>(trial) + 5000);
      RoundSpec spec;
      spec.n = 12;
      spec.fault = static_cast<Fault>(trial % 4);
      spec.scale = scale;
      const Round round = MakeRound(spec, rng);
      LocalizationOptions no_margin;
      no_margin.min_margin_s = 0.0;
      const Localization loc = Localize({round.transfers, {}, round.gemms, {}}, no_margin).value();
      EXPECT_EQ(Mismatch(loc, round), "") << trial << " scale " << scale;
      const Localization with_margin = Localize({round.transfers, {}, round.gemms, {}}).value();
      if (scale >= 1.0) {
        EXPECT_EQ(Mismatch(with_margin, round), "") << trial << " scale " << scale;
      }
      if (scale == 1e-6) {
        EXPECT_TRUE(with_margin.nothing_found()) << trial;
      }
    }
  }
}

TEST(LocalizeTest, NoisyHealthyRoundsReportNothing) {
  for (const double cov : {0.01, 0.02, 0.03, 0.04}) {
    for (int trial = 0; trial < 200; ++trial) {
      testing::Rng rng(static_cast<std::uint64_t>(trial) + 9000);
      RoundSpec spec;
      spec.n = 2 + rng.Next() % 63;
      spec.cov = cov;
      const Round round = MakeRound(spec, rng);
      const Localization loc = Localize({round.transfers, {}, round.gemms, {}}).value();
      EXPECT_TRUE(loc.nothing_found()) << "cov " << cov << " trial " << trial << " n " << spec.n;
    }
  }
}

TEST(LocalizeTest, RejectsBadInput) {
  struct Case {
    const char* what;
    std::vector<TransferMeasurement> transfers;
    std::vector<GemmMeasurement> gemms;
    LocalizationOptions options;
  };
  const TransferMeasurement ok{0, 0, 1, 0, 1, 0.01, 1024};
  TransferMeasurement zero_bytes = ok, nan_time = ok, self = ok;
  zero_bytes.bytes = 0;
  nan_time.median_s = std::nan("");
  self.receiver = 0;
  LocalizationOptions low_ratio, small_baseline;
  low_ratio.gemm_ratio = 0.9;
  small_baseline.min_baseline = 1;
  const Case cases[] = {
      {"zero bytes", {zero_bytes}, {}, {}},
      {"NaN time", {nan_time}, {}, {}},
      {"self transfer", {self}, {}, {}},
      {"negative GEMM", {}, {{0, 0, -1.0}}, {}},
      {"ratio below 1", {ok}, {}, low_ratio},
      {"baseline of one", {ok}, {}, small_baseline},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(Localize({c.transfers, {}, c.gemms, {}}, c.options).ok()) << c.what;
  }
  const Result<Localization> empty = Localize({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty.value().nothing_found());
}

}  // namespace
}  // namespace falcon::analyzer

namespace falcon::analyzer {
namespace {

// A slow NIC slows every link touching it, so its neighbours' links to it are slow too. With one
// unrelated slow link between two neighbours, each of them has two slow peers out of two or
// three tested: without explaining away they would be reported as slow NICs as well. The NIC
// with the most slow peers is taken first and its links explained; the rest is judged on what is
// left: one NIC (node 0) and one link (1-2).
TEST(LocalizeTest, ASlowNicsNeighboursAreExplainedAway) {
  const std::vector<std::pair<int, int>> pairs = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7},
                                                  {7, 0}, {0, 2}, {0, 4}, {0, 6}, {3, 5}, {5, 7}, {3, 7}};
  std::vector<TransferMeasurement> transfers;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const auto [a, b] = pairs[i];
    const bool slow = a == 0 || b == 0 || (a == 1 && b == 2);
    const double healthy = 1e-3 * (1.0 + 0.01 * static_cast<double>(i % 5));
    transfers.push_back({0, a, b, a, b, slow ? 3 * healthy : healthy, 1 << 20});
  }
  const Result<Localization> loc = Localize({transfers, {}, {}, {}});
  ASSERT_TRUE(loc.ok()) << loc.status().ToString();
  ASSERT_EQ(loc.value().nics.size(), 1u);
  EXPECT_EQ(loc.value().nics[0].node, 0);
  EXPECT_EQ(loc.value().nics[0].links.size(), 5u);
  ASSERT_EQ(loc.value().links.size(), 1u);
  EXPECT_EQ(std::minmax(loc.value().links[0].sender_node, loc.value().links[0].receiver_node), std::minmax(1, 2));
}

// A throttled GPU sends and receives slowly too (NCCL's copy kernels run on its SMs): its links
// measure slow, by less than its GEMM. Those links are the GPU's doing and are listed under it;
// a link slower than the GPU at its end is something else and is named on its own. Both ends
// slow: the link goes to the slower GPU.
TEST(LocalizeTest, ASlowGpusOwnLinksAreExplainedByIt) {
  struct Case {
    const char* what;
    double gpu7, gpu2;  // GEMM slowdowns of ranks 7 and 2 (1 = healthy)
    double link;        // slowdown of the 2-7 transfers
    std::size_t want_gpus, want_links;
    std::int32_t explained_by;  // rank whose GPU lists the link; -1: none
  };
  const Case cases[] = {
      {"link slowed by its GPU", 2.4, 1.0, 1.65, 1, 0, 7},
      {"link as slow as its GPU", 2.0, 1.0, 2.0, 1, 0, 7},
      {"link slower than its GPU", 1.5, 1.0, 3.0, 1, 1, -1},
      {"both ends slow, the slower explains", 1.6, 2.5, 2.0, 2, 0, 2},
      {"no slow GPU", 1.0, 1.0, 2.0, 0, 1, -1},
  };
  for (const Case& c : cases) {
    std::vector<TransferMeasurement> transfers;
    std::vector<GemmMeasurement> gemms;
    for (std::int32_t r = 0; r < 8; ++r) {
      const double jitter = 1.0 + 0.01 * static_cast<double>(r % 3);
      const std::int32_t next = (r + 1) % 8;
      transfers.push_back({0, r, next, 0, 0, 1e-3 * jitter, 1 << 20});
      const double gpu = r == 7 ? c.gpu7 : r == 2 ? c.gpu2 : 1.0;
      gemms.push_back({r, 0, 0.05 * jitter * gpu});
    }
    transfers.push_back({1, 2, 7, 0, 0, 1e-3 * c.link, 1 << 20});
    transfers.push_back({1, 7, 2, 0, 0, 1e-3 * c.link, 1 << 20});
    const Result<Localization> loc = Localize({transfers, {}, gemms, {}});
    ASSERT_TRUE(loc.ok()) << loc.status().ToString();
    const Localization& l = loc.value();
    EXPECT_EQ(l.gpus.size(), c.want_gpus) << c.what;
    EXPECT_EQ(l.links.size(), c.want_links) << c.what;
    EXPECT_TRUE(l.nics.empty()) << c.what;
    for (const SlowGpu& g : l.gpus) {
      if (g.rank != c.explained_by) {
        EXPECT_TRUE(g.links.empty()) << c.what << ": rank " << g.rank;
        continue;
      }
      ASSERT_EQ(g.links.size(), 1u) << c.what;
      EXPECT_EQ(std::minmax(g.links[0].sender, g.links[0].receiver), std::minmax(2, 7)) << c.what;
      EXPECT_EQ(g.links[0].measurements, 2u) << c.what;
    }
  }
}

}  // namespace
}  // namespace falcon::analyzer
