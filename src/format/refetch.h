// Fetching bytes again that failed their checks, one rule for every reader: from an object they
// may have been damaged on the way, so they are fetched again after a backoff, up to the source's
// refetch_attempts() in all; a local file's bytes would be the same, so it gets one attempt.
#pragma once

#include <string>

#include "common/byte_source.h"

namespace zckpt::format::internal {

class Refetch {
 public:
  // `source`: where the bytes come from (nullptr: a local file or memory, one attempt).
  explicit Refetch(const ByteSource* source) : source_(source), attempts_(source ? source->refetch_attempts() : 1) {}
  // After failed attempt `attempt` (1-based): waits the source's backoff and returns true when
  // another attempt should be made, else false.
  bool Again(unsigned attempt) const {
    if (attempt >= attempts_) return false;
    source_->BackoffBeforeRetry(attempt);
    return true;
  }
  // What a failure that survived every attempt adds to its message: " (the same after N
  // fetches<what>)", or nothing after a single attempt.
  std::string Persisted(const char* what = "") const {
    return attempts_ > 1 ? " (the same after " + std::to_string(attempts_) + " fetches" + what + ")" : "";
  }

 private:
  const ByteSource* source_;
  unsigned attempts_;
};

}  // namespace zckpt::format::internal
