// Version, status strings and the thread-local last error.
#include "capi/src/guard.hpp"

static_assert(BRAID_OK == static_cast<int>(braid::Status::ok));
static_assert(BRAID_ERR_INVALID_ARGUMENT == static_cast<int>(braid::Status::invalid_argument));
static_assert(BRAID_ERR_BAD_CONFIG == static_cast<int>(braid::Status::bad_config));
static_assert(BRAID_ERR_INFEASIBLE == static_cast<int>(braid::Status::infeasible));
static_assert(BRAID_ERR_IO == static_cast<int>(braid::Status::io));
static_assert(BRAID_ERR_UNSUPPORTED == static_cast<int>(braid::Status::unsupported));
static_assert(BRAID_ERR_INTERNAL == static_cast<int>(braid::Status::internal));
static_assert(BRAID_ERR_OUT_OF_MEMORY == static_cast<int>(braid::Status::out_of_memory));
static_assert(BRAID_ERR_PLUGIN == static_cast<int>(braid::Status::plugin));

namespace braid::capi {
namespace {
thread_local std::string last_error;
}

std::string entry_message(const char* function, const Error& e) {
  const std::string message = e.what();
  if (e.status() != Status::invalid_argument || message.rfind(function, 0) == 0) return message;
  return std::string(function) + ": " + message;
}

braid_status fail(braid_status status, const std::string& message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    // Out of memory while recording the message: keep the status, lose the text.
  }
  return status;
}

std::string struct_size_problem(const char* name, const char* type, std::size_t given,
                                std::span<const std::size_t> versions) {
  const std::size_t known = versions.back();
  std::string text = std::string(name) + "->struct_size is " + std::to_string(given);
  if (given > BRAID_MAX_STRUCT_SIZE) {
    text +=
        ", above BRAID_MAX_STRUCT_SIZE (" + std::to_string(BRAID_MAX_STRUCT_SIZE) + "): no braid struct is that large";
  } else if (given < versions.front()) {
    text += ", below the first version of " + std::string(type) + " (" + std::to_string(versions.front()) + " bytes)";
  } else if (given < known) {
    // It ends inside a field of a version: "it takes 40 or at least 56 bytes".
    text += ", between the versions of " + std::string(type) + ": it takes ";
    for (std::size_t k = 0; k + 1 < versions.size(); ++k)
      text += std::to_string(versions[k]) + (k + 2 < versions.size() ? ", " : " or ");
    text += "at least " + std::to_string(known) + " bytes";
  }
  return text + "; set it to sizeof(" + type + ") (" + std::to_string(known) + ")";
}

std::string struct_size_problem(const char* name, const char* type, std::size_t given, std::size_t first,
                                std::size_t known) {
  const std::size_t versions[] = {first, known};
  return struct_size_problem(name, type, given, std::span<const std::size_t>(versions).subspan(first == known ? 1 : 0));
}

}  // namespace braid::capi

#define BRAID_STR2(x) #x
#define BRAID_STR(x) BRAID_STR2(x)

extern "C" {

BRAID_API uint32_t braid_abi_version(void) { return BRAID_ABI_VERSION; }

BRAID_API const char* braid_version_string(void) {
  return BRAID_STR(BRAID_VERSION_MAJOR) "." BRAID_STR(BRAID_VERSION_MINOR) "." BRAID_STR(BRAID_VERSION_PATCH);
}

BRAID_API const char* braid_status_string(braid_status status) {
  int raw = 0;  // any int may arrive from C; do not load it as an enum
  std::memcpy(&raw, &status, sizeof raw);
  if (raw < 0 || raw > BRAID_ERR_PLUGIN) return "unknown status";
  return braid::status_name(static_cast<braid::Status>(raw));
}

BRAID_API const char* braid_last_error(void) { return braid::capi::last_error.c_str(); }

}  // extern "C"
