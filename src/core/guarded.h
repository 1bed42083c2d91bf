// Exceptions stop at the collective boundary: a step of a rank that throws (std::bad_alloc
// for a large but legitimate buffer, a dcp::Error from a helper) would skip the collective
// that shares its outcome, and the other ranks would wait there until the timeout. Guarded
// turns the exception into the step's Status, which the next agreement hands to every rank.
#pragma once

#include <new>
#include <string>

#include "dcp/status.h"

namespace dcp {

// fn() returns Status or Result<T>; so does Guarded, with any exception as its error.
template <typename F>
auto Guarded(const std::string& what, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    return Status(e.code(), what + e.what());
  } catch (const std::bad_alloc&) {
    return Unavailable(what + "out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Internal(what + "unexpected exception: " + e.what());
  }
}

}  // namespace dcp
