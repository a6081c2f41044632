// Megatron-style rank layout of a TP x DP x PP job: tensor-parallel rank fastest, then data
// parallel, then pipeline stage.
//
//   rank = pp_rank * dp * tp + dp_rank * tp + tp_rank
//
// The group a rank belongs to in each dimension is numbered by the coordinates it does not vary
// (these numbers are the ncclCommSplit colors): TP group = pp_rank * dp + dp_rank, DP group =
// pp_rank * tp + tp_rank, PP group = dp_rank * tp + tp_rank. Inside each group, members are
// ordered by global rank, so a rank's index in its TP/DP/PP communicator is its tp/dp/pp
// coordinate.
//
// Thread-safety: pure value types and functions. Must never: perform I/O.
#ifndef FALCON_BENCH_TRAIN_LAYOUT_H_
#define FALCON_BENCH_TRAIN_LAYOUT_H_

#include <string>

#include "falcon/status.h"

namespace falcon::train {

struct Shape {
  int tp = 1;
  int dp = 1;
  int pp = 1;
  [[nodiscard]] int world() const { return tp * dp * pp; }
};

struct Coords {
  int tp = 0;
  int dp = 0;
  int pp = 0;
};

// OK when every dimension is >= 1 and tp * dp * pp == world_size; otherwise an
// InvalidArgument that names the shape and the world size.
[[nodiscard]] Status ValidateShape(const Shape& shape, int world_size);

// REQUIRES: 0 <= rank < shape.world().
[[nodiscard]] Coords CoordsOf(const Shape& shape, int rank);
// REQUIRES: coordinates in range.
[[nodiscard]] int RankOf(const Shape& shape, const Coords& c);

[[nodiscard]] int TpGroupOf(const Shape& shape, const Coords& c);
[[nodiscard]] int DpGroupOf(const Shape& shape, const Coords& c);
[[nodiscard]] int PpGroupOf(const Shape& shape, const Coords& c);

// "tp=2 dp=2 pp=2".
[[nodiscard]] std::string ToString(const Shape& shape);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_LAYOUT_H_
