// Writes the spec's test vectors (format-spec/vectors/) into the folder given as argv[1]. Run
// through tools/make-spec-vectors.sh.
#include <cstdio>
#include <string>

#include "spec_vectors.h"
#include "test_util.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    for (const auto& v : zckpt::testing::MakeSpecVectors()) {
      std::string base = std::string(argv[1]) + "/" + v.name;
      zckpt::testing::WriteFileBytes(base + ".zckpt", v.bytes);
      zckpt::testing::WriteFileBytes(base + ".json", std::vector<uint8_t>(v.json.begin(), v.json.end()));
      std::printf("%s.zckpt (%zu bytes)\n", base.c_str(), v.bytes.size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_spec_vectors: %s\n", e.what());
    return 1;
  }
  return 0;
}
