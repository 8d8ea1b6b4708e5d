// Every C entry point runs its body inside BRAID_API_BEGIN / BRAID_API_END: the
// one place where C++ exceptions become a braid_status and braid_last_error().
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <string>

#include "braid/braid.h"
#include "core/common/error.hpp"

namespace braid::capi {

// Records the message of the failing call for braid_last_error() on this thread. Only
// failures write it: a successful call leaves the last failure's message in place.
braid_status fail(braid_status status, const std::string& message) noexcept;
// The message of an error braid threw inside entry point `function`: a bad argument's is
// prefixed with the function ("braid_groups_create: the plan runs on 4 devices but the
// world has 0 ranks"), unless it names it already; others (a run file's line and field,
// an I/O error's path) are as thrown.
std::string entry_message(const char* function, const Error& e);

// "info->struct_size is 8, below the first version of braid_stage_info (96 bytes); set it
// to sizeof(braid_stage_info) (112)", or why another size is refused: above
// BRAID_MAX_STRUCT_SIZE, or (a struct the library reads) between two of `versions`, the
// struct's version sizes, oldest first, the last this library's sizeof.
std::string struct_size_problem(const char* name, const char* type, std::size_t given,
                                std::span<const std::size_t> versions);
// The same for a struct whose sizes from `first` to `known` (its sizeof) are all accepted.
std::string struct_size_problem(const char* name, const char* type, std::size_t given, std::size_t first,
                                std::size_t known);

// A struct's version sizes are what its old headers' sizeof was: where the next version's
// fields begin, on a multiple of alignof(T) so that no tail padding of an old version
// overlaps a newer field; ascending, the last this library's sizeof(T).
template <class T, std::size_t N>
constexpr bool valid_versions(const std::size_t (&sizes)[N]) {
  for (std::size_t k = 0; k < N; ++k)
    if (sizes[k] < sizeof(std::size_t) || sizes[k] % alignof(T) != 0 || (k > 0 && sizes[k] <= sizes[k - 1]))
      return false;
  return sizes[N - 1] == sizeof(T);
}

// `first` is sizeof(T) or the size of an older version of T.
template <class T>
constexpr bool valid_first_version(std::size_t first) {
  const std::size_t sizes[] = {first, sizeof(T)};
  return first == sizeof(T) || valid_versions<T>(sizes);
}

// Copies a library struct into a caller's struct that starts with struct_size,
// honouring the caller's size: fields beyond it are not written; fields the
// caller knows but this library does not are zeroed.
// The caller's struct_size is at most BRAID_MAX_STRUCT_SIZE (BRAID_REQUIRE_STRUCT).
template <class T>
void copy_out(const T& value, T* out) {
  std::size_t caller = out->struct_size;
  std::size_t n = caller < sizeof(T) ? caller : sizeof(T);
  T tmp = value;
  tmp.struct_size = caller;
  std::memcpy(static_cast<void*>(out), &tmp, n);
  if (caller > sizeof(T)) std::memset(reinterpret_cast<char*>(out) + sizeof(T), 0, caller - sizeof(T));
}

// Reads a caller's struct into `out` (which holds the defaults): its struct_size must be
// one of `versions` (valid_versions) or larger than this library's sizeof(T) up to
// BRAID_MAX_STRUCT_SIZE. A size inside a version would split a field (half a pointer,
// then dereferenced). Copies min(struct_size, sizeof(T)) bytes: fields an older caller
// lacks keep their defaults. Returns BRAID_OK or the status of the recorded failure.
template <class T>
braid_status read_struct(const char* func, const char* name, const char* type, const char* init, const T* in,
                         std::span<const std::size_t> versions, T* out) noexcept {
  try {
    const std::size_t size = in->struct_size;
    const bool known = size >= sizeof(T) ? size <= BRAID_MAX_STRUCT_SIZE
                                         : std::find(versions.begin(), versions.end(), size) != versions.end();
    if (!known)
      return fail(BRAID_ERR_INVALID_ARGUMENT, std::string(func) + ": " +
                                                  struct_size_problem(name, type, size, versions) +
                                                  ": initialise the struct with " + init);
    std::memcpy(static_cast<void*>(out), in, size < sizeof(T) ? size : sizeof(T));
    return BRAID_OK;
  } catch (...) {
    return fail(BRAID_ERR_OUT_OF_MEMORY, "out of host memory");
  }
}

// Reads a caller's option struct as read_struct does, and checks its version (0 is
// invalid; newer than `known` is refused with BRAID_ERR_UNSUPPORTED, since this library
// cannot honour options it does not know).
template <class T>
braid_status read_options(const char* func, const char* name, const char* type, const char* init,
                          const char* version_macro, const T* in, std::span<const std::size_t> versions,
                          std::uint32_t known, T* out) noexcept {
  const braid_status status = read_struct(func, name, type, init, in, versions, out);
  if (status != BRAID_OK) return status;
  try {
    const std::string where = std::string(func) + ": " + name;
    if (in->version == 0)
      return fail(BRAID_ERR_INVALID_ARGUMENT, where + "->version is 0; initialise the struct with " + init + " (" +
                                                  version_macro + " is " + std::to_string(known) + ")");
    if (in->version > known)
      return fail(BRAID_ERR_UNSUPPORTED,
                  where + "->version is " + std::to_string(in->version) + ", newer than this library's " +
                      version_macro + " (" + std::to_string(known) +
                      "): it cannot honour fields it does not know; use a libbraid at least as new as the "
                      "braid headers the caller was compiled with");
    return BRAID_OK;
  } catch (...) {
    return fail(BRAID_ERR_OUT_OF_MEMORY, "out of host memory");
  }
}

}  // namespace braid::capi

#define BRAID_API_BEGIN try {
#define BRAID_API_END                                                                                             \
  }                                                                                                               \
  catch (const ::braid::Error& e) {                                                                               \
    return ::braid::capi::fail(static_cast<braid_status>(e.status()), ::braid::capi::entry_message(__func__, e)); \
  }                                                                                                               \
  catch (const std::bad_alloc&) {                                                                                 \
    return ::braid::capi::fail(BRAID_ERR_OUT_OF_MEMORY, "out of host memory");                                    \
  }                                                                                                               \
  catch (const std::exception& e) {                                                                               \
    return ::braid::capi::fail(BRAID_ERR_INTERNAL, std::string("internal error: ") + e.what());                   \
  }                                                                                                               \
  catch (...) {                                                                                                   \
    return ::braid::capi::fail(BRAID_ERR_INTERNAL, "internal error: unknown exception");                          \
  }

// Argument checks that return BRAID_ERR_INVALID_ARGUMENT with the argument's name.
#define BRAID_REQUIRE(cond, what) \
  if (!(cond)) return ::braid::capi::fail(BRAID_ERR_INVALID_ARGUMENT, std::string(__func__) + ": " + (what))

// A caller's struct: not NULL, at least as large as its first version (`first_version`:
// sizeof, or where the fields added later begin) and at most BRAID_MAX_STRUCT_SIZE (larger
// than this library's, from a newer caller, is fine: copy_out fills what this library
// knows and zeroes the rest).
#define BRAID_REQUIRE_STRUCT(ptr, type, first_version)                                                \
  static_assert(::braid::capi::valid_first_version<type>(first_version),                              \
                #type ": " #first_version " is not the size of a version");                           \
  BRAID_REQUIRE(ptr, #ptr " is NULL");                                                                \
  BRAID_REQUIRE((ptr)->struct_size >= (first_version) && (ptr)->struct_size <= BRAID_MAX_STRUCT_SIZE, \
                ::braid::capi::struct_size_problem(#ptr, #type, (ptr)->struct_size, first_version, sizeof(type)))

// Reads option struct `ptr` (non-NULL) of `type` into `*out` with read_options; `versions`
// names a constexpr array of its version sizes (valid_versions). Returns its failure.
#define BRAID_READ_OPTIONS(ptr, type, versions, version_macro, init_macro, out)                             \
  do {                                                                                                      \
    static_assert(::braid::capi::valid_versions<type>(versions), #versions " are not the sizes of " #type); \
    const braid_status braid_read_status_ = ::braid::capi::read_options(                                    \
        __func__, #ptr, #type, #init_macro, #version_macro, ptr, versions, version_macro, out);             \
    if (braid_read_status_ != BRAID_OK) return braid_read_status_;                                          \
  } while (0)
