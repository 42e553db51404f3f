// The test vectors of spec §10: small containers and, for each, a JSON file with its expected
// decoding (or the reason it must be refused). Written by tools/make-spec-vectors.sh through
// make_spec_vectors, and checked by vectors_test against the committed copies.
#pragma once

#include <string>
#include <vector>

#include "zckpt/container.h"

namespace zckpt::testing {

struct SpecVector {
  std::string name;  // file name without extension
  std::vector<uint8_t> bytes;
  std::string json;
  bool depends_on_zstd_version = false;  // its compressed bytes may differ with another libzstd
};

std::vector<SpecVector> MakeSpecVectors();

// The expected-decoding JSON of a container that opens: superblock, footer, every table, tensor
// values as hex (in logical element order).
std::string DescribeContainerJson(const Container& c);

}  // namespace zckpt::testing
