// Placeholder translation unit until the detection core lands; removed by it.
namespace falcon::analyzer {}
