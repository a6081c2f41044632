// Rank layout arithmetic; see layout.h. Pure.
#include "layout.h"

namespace falcon::train {

Status ValidateShape(const Shape& s, int world_size) {
  if (s.tp < 1 || s.dp < 1 || s.pp < 1) {
    return Status::InvalidArgument("--tp, --dp and --pp must each be >= 1 (got " + ToString(s) + ")");
  }
  if (static_cast<long long>(s.tp) * s.dp * s.pp != world_size) {
    return Status::InvalidArgument("tp*dp*pp = " + std::to_string(static_cast<long long>(s.tp) * s.dp * s.pp) +
                                   " (" + ToString(s) + ") does not equal the world size " +
                                   std::to_string(world_size) + " (WORLD_SIZE / falcon-emu-run -n)");
  }
  return Status::Ok();
}

Coords CoordsOf(const Shape& s, int rank) {
  Coords c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  return c;
}

int RankOf(const Shape& s, const Coords& c) { return c.pp * s.dp * s.tp + c.dp * s.tp + c.tp; }

int TpGroupOf(const Shape& s, const Coords& c) { return c.pp * s.dp + c.dp; }
int DpGroupOf(const Shape& s, const Coords& c) { return c.pp * s.tp + c.tp; }
int PpGroupOf(const Shape& s, const Coords& c) { return c.dp * s.tp + c.tp; }

std::string ToString(const Shape& s) {
  return "tp=" + std::to_string(s.tp) + " dp=" + std::to_string(s.dp) + " pp=" + std::to_string(s.pp);
}

}  // namespace falcon::train
