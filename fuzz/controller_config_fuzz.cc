// Fuzz target: falcon-controller's configuration, from a config file's text (ApplyConfigText, as
// LoadConfigFile applies it) or from one option's flag value (the same validators serve flags,
// FALCON_CONTROLLER_* variables and files). The input's first byte picks the source; with a flag,
// the second picks the option. Checked: no crash and no exception out of the parser; nan and inf
// never reach a number option; an accepted configuration renders (--print-config) to a file that
// is accepted again and renders the same.
#include <CLI/CLI.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "daemon/controller/controller_config.h"
#include "fuzz/fuzz_input.h"

namespace {

using falcon::controller::ConfigStyle;
using falcon::controller::ControllerConfig;

void CheckFinite(const ControllerConfig& c) {
  const double numbers[] = {c.profile_wait_s, c.retry_after_s, c.min_slow_fraction, c.suspicious_ratio,
                            c.gemm_ratio, c.link_ratio, c.validation.pause_lead_s, c.validation.max_pause_s,
                            c.validation.ack_timeout_s, c.mitigation.sample_s, c.mitigation.recheck_s,
                            c.mitigation.overheads.rebalance_s, c.mitigation.overheads.topology_s,
                            c.mitigation.overheads.restart_s};
  for (const double v : numbers) {
    if (!std::isfinite(v)) falcon::fuzz::PropertyFailed("a number option holds nan or inf");
  }
}

void CheckRoundTrip(const CLI::App& app) {
  const std::string rendered = falcon::controller::RenderConfig(app, ConfigStyle::kDocumented);
  CLI::App again;
  ControllerConfig config;
  falcon::controller::AddConfigOptions(again, config);
  again.parse(std::vector<std::string>{});
  if (!falcon::controller::ApplyConfigText(again, rendered, "rendered").ok()) {
    falcon::fuzz::PropertyFailed("a rendered configuration is refused");
  }
  if (falcon::controller::RenderConfig(again, ConfigStyle::kDocumented) != rendered) {
    falcon::fuzz::PropertyFailed("a configuration changes when its rendering is read back");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  fuzz::FuzzInput in(data, size);
  const bool from_flag = in.Bool();
  const uint64_t which = in.Take<uint8_t>();
  const std::string text(in.Rest());
  CLI::App app;
  ControllerConfig config;
  controller::AddConfigOptions(app, config);
  if (from_flag) {
    const std::vector<CLI::Option*> options = app.get_options();
    const CLI::Option* o = options[which % options.size()];
    if (o->get_single_name().empty()) return 0;
    try {
      app.parse(std::vector<std::string>{text, "--" + o->get_single_name()});  // reversed, as CLI11 takes them
    } catch (const CLI::ParseError&) {
      return 0;  // refused: the message is CLI11's, naming the option
    }
  } else {
    app.parse(std::vector<std::string>{});
    if (!controller::ApplyConfigText(app, text, "fuzz.conf").ok()) return 0;
  }
  CheckFinite(config);
  if (controller::CheckConfig(config).ok()) CheckRoundTrip(app);
  return 0;
}
