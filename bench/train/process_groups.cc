// Megatron-LM's process groups as data; see process_groups.h. Pure.
#include "process_groups.h"

#include <algorithm>

namespace falcon::train {
namespace {

// The groups that vary the coordinates `vary` says (tp, dp, pp) and fix the others, numbered by
// the fixed coordinates with the lower dimension fastest (Megatron's RankGenerator order).
void AddGroups(const Shape& s, Group kind, bool vary_tp, bool vary_dp, bool vary_pp, std::vector<GroupSpec>* out) {
  const int ntp = vary_tp ? 1 : s.tp, ndp = vary_dp ? 1 : s.dp, npp = vary_pp ? 1 : s.pp;
  int index = 0;
  for (int fp = 0; fp < npp; ++fp) {
    for (int fd = 0; fd < ndp; ++fd) {
      for (int ft = 0; ft < ntp; ++ft) {
        GroupSpec g;
        g.kind = kind;
        g.index = index++;
        for (int p = 0; p < (vary_pp ? s.pp : 1); ++p) {
          for (int d = 0; d < (vary_dp ? s.dp : 1); ++d) {
            for (int t = 0; t < (vary_tp ? s.tp : 1); ++t) {
              g.ranks.push_back(RankOf(s, {vary_tp ? t : ft, vary_dp ? d : fd, vary_pp ? p : fp}));
            }
          }
        }
        std::sort(g.ranks.begin(), g.ranks.end());
        out->push_back(std::move(g));
      }
    }
  }
}

}  // namespace

const char* GroupName(Group g) {
  switch (g) {
    case Group::kWorld: return "world";
    case Group::kDpCp: return "dp-cp";
    case Group::kDp: return "dp";
    case Group::kCp: return "cp";
    case Group::kMp: return "mp";
    case Group::kTp: return "tp";
    case Group::kPp: return "pp";
    case Group::kEmbd: return "embd";
    case Group::kPosEmbd: return "pos-embd";
    case Group::kTpDpCp: return "tp-dp-cp";
    case Group::kTpDp: return "tp-dp";
    case Group::kTpCp: return "tp-cp";
    case Group::kPpFwdEven: return "pp-fwd-even";
    case Group::kPpFwdOdd: return "pp-fwd-odd";
    case Group::kPpBwdEven: return "pp-bwd-even";
    case Group::kPpBwdOdd: return "pp-bwd-odd";
  }
  return "?";
}

Group PpPairGroup(bool forward, int first_stage) {
  const bool even = first_stage % 2 == 0;
  if (forward) return even ? Group::kPpFwdEven : Group::kPpFwdOdd;
  return even ? Group::kPpBwdEven : Group::kPpBwdOdd;
}

std::vector<GroupSpec> MegatronGroups(const Shape& s, bool pp_direction_groups) {
  std::vector<GroupSpec> out;
  AddGroups(s, Group::kDpCp, false, true, false, &out);
  AddGroups(s, Group::kDp, false, true, false, &out);
  AddGroups(s, Group::kCp, false, false, false, &out);  // context parallel = 1: one rank each
  AddGroups(s, Group::kMp, true, false, true, &out);
  AddGroups(s, Group::kTp, true, false, false, &out);
  std::vector<GroupSpec> pp;
  AddGroups(s, Group::kPp, false, false, true, &pp);
  for (GroupSpec& g : pp) {
    GroupSpec embd{Group::kEmbd, g.index, {g.ranks.front()}};
    if (g.ranks.size() > 1) embd.ranks.push_back(g.ranks.back());
    GroupSpec pos{Group::kPosEmbd, g.index, {g.ranks.front()}};
    out.push_back(std::move(g));
    out.push_back(std::move(embd));
    out.push_back(std::move(pos));
  }
  AddGroups(s, Group::kTpDpCp, true, true, false, &out);
  AddGroups(s, Group::kTpDp, true, true, false, &out);
  AddGroups(s, Group::kTpCp, true, false, false, &out);
  if (pp_direction_groups) {
    // PP group i holds the ranks of (tp, dp) = (i % tp, i / tp) (AddGroups' numbering); its pair
    // (st, st + 1) is group i * pp + st of its kind.
    for (const bool forward : {true, false}) {
      for (int i = 0; i < s.tp * s.dp; ++i) {
        for (int st = 0; st + 1 < s.pp; ++st) {
          GroupSpec g{PpPairGroup(forward, st), i * s.pp + st,
                      {RankOf(s, {i % s.tp, i / s.tp, st}), RankOf(s, {i % s.tp, i / s.tp, st + 1})}};
          std::sort(g.ranks.begin(), g.ranks.end());
          out.push_back(std::move(g));
        }
      }
    }
  }
  return out;
}

int MemberIndex(const GroupSpec& g, int rank) {
  const auto it = std::find(g.ranks.begin(), g.ranks.end(), rank);
  return it == g.ranks.end() ? -1 : static_cast<int>(it - g.ranks.begin());
}

}  // namespace falcon::train
