// Bit-exact checks of the datatype conversions (fp16, bf16, fp8 e4m3 FN / e5m2 with saturation)
// and the integer reduction rules. Pure code.
// Thread-safety: single-threaded. Must never: depend on the environment.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "datatypes.h"

namespace falcon::emu {
namespace {

TEST(DatatypesTest, HalfKnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // rounds to inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7C00; ++h) EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h);
}

TEST(DatatypesTest, Bf16KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(Bf16ToFloat(0xC040), -3.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST(DatatypesTest, Fp8E4M3IsFnAndSaturates) {
  EXPECT_EQ(FloatToE4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(FloatToE4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToE4M3(std::nanf("")), 0x7F);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7F)));
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  for (uint32_t v = 0; v < 256; ++v) {
    if ((v & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToE4M3(E4M3ToFloat(static_cast<uint8_t>(v))), v) << v;
  }
}

TEST(DatatypesTest, Fp8E5M2Saturates) {
  EXPECT_EQ(FloatToE5M2(1.0f), 0x3C);
  EXPECT_EQ(FloatToE5M2(57344.0f), 0x7B);
  EXPECT_EQ(FloatToE5M2(1e6f), 0x7B);
  EXPECT_EQ(FloatToE5M2(std::numeric_limits<float>::infinity()), 0x7B);
  EXPECT_TRUE(std::isinf(E5M2ToFloat(0x7C)));
  for (uint32_t v = 0; v < 0x7C; ++v) EXPECT_EQ(FloatToE5M2(E5M2ToFloat(static_cast<uint8_t>(v))), v) << v;
}

TEST(DatatypesTest, IntegerReductionWrapsAndAvgTruncates) {
  const int8_t a[2] = {100, -7}, b[2] = {100, 0};
  const void* srcs[2] = {a, b};
  int8_t out[2];
  Reduce(DType::kInt8, RedKind::kSum, out, srcs, 2, 2);
  EXPECT_EQ(out[0], static_cast<int8_t>(-56));
  EXPECT_EQ(out[1], -7);
  IntDivide(DType::kInt8, out, 2, 2);
  EXPECT_EQ(out[0], -28);
  EXPECT_EQ(out[1], -3);  // truncation toward zero
  Reduce(DType::kInt8, RedKind::kProd, out, srcs, 2, 2);
  EXPECT_EQ(out[0], static_cast<int8_t>(10000 & 0xFF));
}

TEST(DatatypesTest, HalfReducesThroughFloatRoundingOnce) {
  // 2048 + 1 + 1 in half: pairwise half rounding would give 2048; through float it is 2050.
  const uint16_t x[1] = {FloatToHalf(2048.0f)}, y[1] = {FloatToHalf(1.0f)}, z[1] = {FloatToHalf(1.0f)};
  const void* srcs[3] = {x, y, z};
  uint16_t out[1];
  Reduce(DType::kFloat16, RedKind::kSum, out, srcs, 3, 1);
  EXPECT_EQ(HalfToFloat(out[0]), 2050.0f);
}

}  // namespace
}  // namespace falcon::emu
