// Fuzz target: falcon-agent's configuration, from a file's text and from the environment (both
// are outside input: a config management tool writes one, a job launcher the other). The input's
// first byte picks the source. Checked: no crash or throw; a configuration that was accepted
// renders to a file that is accepted again and renders the same (what --print-config shows can
// be fed back; secrets, which are never printed, aside).
#include <string>
#include <variant>

#include "daemon/agent/agent_config.h"
#include "fuzz/fuzz_input.h"

namespace {

void CheckRoundTrip(const falcon::agent::AgentConfig& config) {
  using falcon::agent::ConfigStyle;
  const std::string rendered = falcon::agent::RenderConfig(config, ConfigStyle::kValues);
  falcon::agent::AgentConfig again;
  if (!falcon::agent::ApplyConfigText(again, rendered, "rendered").ok()) {
    falcon::fuzz::PropertyFailed("a rendered configuration is refused");
  }
  // Secrets are never rendered (a commented-out "<set>"): they carry over as they were.
  for (const falcon::agent::ConfigEntry& entry : falcon::agent::ConfigTable()) {
    if (!entry.secret) continue;
    std::visit([&](auto member) { again.*member = config.*member; }, entry.member);
  }
  if (falcon::agent::RenderConfig(again, ConfigStyle::kValues) != rendered) {
    falcon::fuzz::PropertyFailed("a configuration changes when its rendering is read back");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  fuzz::FuzzInput in(data, size);
  const bool from_environment = in.Bool();
  const std::string text(in.Rest());
  agent::AgentConfig config;
  Status s;
  if (from_environment) {
    // Every variable gets the text (the launcher's value), one entry at a time.
    for (const agent::ConfigEntry& entry : agent::ConfigTable()) {
      agent::AgentConfig one;
      const std::string name = agent::EnvName(entry.name);
      const Status set = agent::ApplyEnvironment(one, [&](const char* var) -> const char* {
        return name == var ? text.c_str() : nullptr;
      });
      if (set.ok() && agent::CheckConfig(one).ok()) CheckRoundTrip(one);
    }
    return 0;
  }
  s = agent::ApplyConfigText(config, text, "fuzz.conf");
  if (s.ok() && agent::CheckConfig(config).ok()) CheckRoundTrip(config);
  return 0;
}
