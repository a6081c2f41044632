// Message validation. See validate.h for the contract.
#include "daemon/protocol/validate.h"

#include <cmath>
#include <string>

namespace falcon::protocol {
namespace {

bool HasType(const nlohmann::json& v, JsonType t) {
  switch (t) {
    case JsonType::kString: return v.is_string();
    case JsonType::kInteger: return v.is_number_integer();
    case JsonType::kNumber: return v.is_number() && std::isfinite(v.get<double>());
    case JsonType::kBoolean: return v.is_boolean();
    case JsonType::kObject: return v.is_object();
    case JsonType::kArray: return v.is_array();
  }
  return false;
}

bool InChoices(std::string_view value, std::string_view choices) {
  while (!choices.empty()) {
    const std::size_t bar = choices.find('|');
    if (choices.substr(0, bar) == value) return true;
    if (bar == std::string_view::npos) break;
    choices.remove_prefix(bar + 1);
  }
  return false;
}

// `where` names the field's container for the log line: "iterations", "rank_register.comms[3]".
Status FieldError(const std::string& where, const FieldSpec& f, const std::string& what) {
  return Status::InvalidArgument(where + "." + std::string(f.name) + ": " + what);
}

Status CheckFields(const std::string& where, std::span<const FieldSpec> fields, const nlohmann::json& m);

Status CheckItems(const std::string& where, const FieldSpec& f, const nlohmann::json& v) {
  std::size_t i = 0;
  for (const auto& item : v) {
    if (!HasType(item, f.items)) {
      return FieldError(where, f, std::string("elements must be ") + JsonTypeName(f.items));
    }
    if (f.items == JsonType::kInteger || f.items == JsonType::kNumber) {
      const double d = item.get<double>();
      if (d < f.item_min || d > f.item_max) {
        return FieldError(where, f, "element " + std::to_string(i) + " out of bounds");
      }
    } else if (f.items == JsonType::kObject && f.item_object != nullptr) {
      Status s = CheckFields(where + "." + std::string(f.name) + "[" + std::to_string(i) + "]",
                             f.item_object->fields, item);
      if (!s.ok()) return s;
    }
    ++i;
  }
  return Status::Ok();
}

Status CheckField(const std::string& where, const FieldSpec& f, const nlohmann::json& v) {
  if (!HasType(v, f.type)) {
    return FieldError(where, f, std::string("want ") + JsonTypeName(f.type) + ", got " +
                                   v.type_name());
  }
  switch (f.type) {
    case JsonType::kString: {
      const auto& s = v.get_ref<const std::string&>();
      if (!f.choices.empty()) {
        if (!InChoices(s, f.choices)) {
          return FieldError(where, f, "'" + s.substr(0, 40) + "' not one of " +
                                         std::string(f.choices));
        }
      } else if (static_cast<double>(s.size()) < std::max(0.0, f.min) ||
                 static_cast<double>(s.size()) > f.max) {
        return FieldError(where, f, "length " + std::to_string(s.size()) + " out of bounds");
      }
      return Status::Ok();
    }
    case JsonType::kInteger:
    case JsonType::kNumber: {
      const double d = v.get<double>();
      if (d < f.min || d > f.max) return FieldError(where, f, "value out of bounds");
      return Status::Ok();
    }
    case JsonType::kArray: {
      if (static_cast<double>(v.size()) < std::max(0.0, f.min) ||
          static_cast<double>(v.size()) > f.max) {
        return FieldError(where, f, std::to_string(v.size()) + " elements: out of bounds");
      }
      return CheckItems(where, f, v);
    }
    case JsonType::kBoolean:
    case JsonType::kObject:
      return Status::Ok();
  }
  return Status::Ok();
}

Status CheckFields(const std::string& where, std::span<const FieldSpec> fields, const nlohmann::json& m) {
  if (!m.is_object()) return Status::InvalidArgument(where + ": not a JSON object");
  for (const FieldSpec& f : fields) {
    const auto it = m.find(f.name);
    if (it == m.end() || it->is_null()) {
      if (f.required) return FieldError(where, f, "required field missing");
      continue;
    }
    Status s = CheckField(where, f, *it);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Result<nlohmann::json> Parse(std::string_view text) {
  if (text.size() > kMaxMessageBytes) {
    return Status::InvalidArgument("message of " + std::to_string(text.size()) +
                                   " bytes exceeds the limit");
  }
  // No exceptions: a parse error yields a discarded value.
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument("not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  return j;
}

}  // namespace

const char* JsonTypeName(JsonType t) {
  switch (t) {
    case JsonType::kString: return "string";
    case JsonType::kInteger: return "integer";
    case JsonType::kNumber: return "number";
    case JsonType::kBoolean: return "boolean";
    case JsonType::kObject: return "object";
    case JsonType::kArray: return "array";
  }
  return "?";
}

Status ValidateMessage(const nlohmann::json& m, const MessageSpec& spec) {
  if (!m.is_object()) return Status::InvalidArgument("not a JSON object");
  const auto v = m.find("v");
  if (v == m.end() || !v->is_number_integer() || v->get<double>() != kSchemaVersion) {
    return Status::InvalidArgument("missing or unsupported schema version \"v\" (want " +
                                   std::to_string(kSchemaVersion) + ")");
  }
  const auto type = m.find("type");
  if (type == m.end() || !type->is_string() || type->get_ref<const std::string&>() != spec.type) {
    return Status::InvalidArgument("\"type\" is not \"" + std::string(spec.type) + "\"");
  }
  return CheckFields(std::string(spec.type), spec.fields, m);
}

Result<nlohmann::json> ParseMessage(std::string_view text, const MessageSpec& spec) {
  Result<nlohmann::json> j = Parse(text);
  if (!j.ok()) return j;
  Status s = ValidateMessage(j.value(), spec);
  if (!s.ok()) return s;
  return j;
}

Result<nlohmann::json> ParseAnyOf(std::string_view text, std::span<const MessageSpec> specs,
                                  const MessageSpec** which) {
  Result<nlohmann::json> j = Parse(text);
  if (!j.ok()) return j;
  const auto type = j.value().find("type");
  if (type == j.value().end() || !type->is_string()) {
    return Status::InvalidArgument("missing \"type\"");
  }
  for (const MessageSpec& spec : specs) {
    if (spec.type == type->get_ref<const std::string&>()) {
      Status s = ValidateMessage(j.value(), spec);
      if (!s.ok()) return s;
      if (which != nullptr) *which = &spec;
      return j;
    }
  }
  return Status::InvalidArgument("unknown message type '" +
                                 type->get_ref<const std::string&>().substr(0, 40) + "'");
}

}  // namespace falcon::protocol
