// Fuzz target: the protocol validators, as every reader of Redis runs them on text that anyone
// with write access to the job's keys could have put there. The input is one message text.
// Checked: validation never throws or crashes; a command it accepts survives its own encoding
// (ToJson, then ParseCommand again, gives the same JSON); a cut_info answer that passed the ack's
// schema is either refused by ParseCutPattern or re-encodes to a pattern it accepts again.
#include <string>

#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  using fuzz::PropertyFailed;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const protocol::MessageSpec* which = nullptr;
  Result<nlohmann::json> any = protocol::ParseAnyOf(text, protocol::kAllMessages, &which);
  if (any.ok()) {
    if (which == nullptr) PropertyFailed("ParseAnyOf accepted a message without naming its spec");
    if (!protocol::ValidateMessage(any.value(), *which).ok()) PropertyFailed("an accepted message fails its own spec");
    if (which == &protocol::kAck && any.value().contains("results")) {
      for (const nlohmann::json& r : any.value()["results"]) {
        if (!r.is_object() || !r.contains("pattern")) continue;
        Result<protocol::CutPatternMessage> cut = protocol::ParseCutPattern(r["pattern"]);
        if (!cut.ok()) continue;
        if (!protocol::ParseCutPattern(protocol::CutPatternToJson(cut.value())).ok()) {
          PropertyFailed("a cut pattern does not survive its own encoding");
        }
      }
    }
  }

  Result<protocol::Command> command = protocol::ParseCommand(text);
  if (command.ok()) {
    const nlohmann::json encoded = protocol::ToJson(command.value());
    Result<protocol::Command> again = protocol::ParseCommand(encoded.dump());
    if (!again.ok()) PropertyFailed("a command does not survive its own encoding");
    if (protocol::ToJson(again.value()) != encoded) PropertyFailed("a command changes through its own encoding");
  } else {
    const auto identity = protocol::SalvageCommandIdentity(text);
    if (identity && (identity->id.empty() || identity->id.size() > 64)) PropertyFailed("a salvaged id out of bounds");
  }
  (void)protocol::ParseCommIdHex(text);
  return 0;
}
