// Invariant checks: a violated one is a bug in dcp, not an error to report, so it stops the
// process with the place and the condition.
#pragma once

#include <cstdio>
#include <cstdlib>

#define DCP_CHECK(cond)                                                                     \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "dcp: internal check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                  \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
