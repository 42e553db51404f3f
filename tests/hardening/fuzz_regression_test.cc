// The fuzz targets' bodies outside libFuzzer: every input a fuzzer found that once crashed
// (tests/fuzz/regressions/<target>/), a small deterministic mutation fuzz of each body so every
// build exercises them, and one named test per bug the fuzzers (or their oracles) found.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "hardening_util.h"
#include "pickle/legacy.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "pt/pt_archive.h"
#include "pt/zip_writer.h"
#include "test_util.h"
#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::hardening {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// torch.save(torch.arange(5), f): its data.pkl, and the same tensor in the legacy format
// (protocol 2), as written by torch 2.x (tests/fuzz/make_seeds.py).
const uint8_t kVectorPickle[] = {
    0x80, 0x02, 0x63, 0x74, 0x6f, 0x72, 0x63, 0x68, 0x2e, 0x5f, 0x75, 0x74, 0x69, 0x6c, 0x73, 0x0a,
    0x5f, 0x72, 0x65, 0x62, 0x75, 0x69, 0x6c, 0x64, 0x5f, 0x74, 0x65, 0x6e, 0x73, 0x6f, 0x72, 0x5f,
    0x76, 0x32, 0x0a, 0x71, 0x00, 0x28, 0x28, 0x58, 0x07, 0x00, 0x00, 0x00, 0x73, 0x74, 0x6f, 0x72,
    0x61, 0x67, 0x65, 0x71, 0x01, 0x63, 0x74, 0x6f, 0x72, 0x63, 0x68, 0x0a, 0x4c, 0x6f, 0x6e, 0x67,
    0x53, 0x74, 0x6f, 0x72, 0x61, 0x67, 0x65, 0x0a, 0x71, 0x02, 0x58, 0x01, 0x00, 0x00, 0x00, 0x30,
    0x71, 0x03, 0x58, 0x03, 0x00, 0x00, 0x00, 0x63, 0x70, 0x75, 0x71, 0x04, 0x4b, 0x05, 0x74, 0x71,
    0x05, 0x51, 0x4b, 0x00, 0x4b, 0x05, 0x85, 0x71, 0x06, 0x4b, 0x01, 0x85, 0x71, 0x07, 0x89, 0x63,
    0x63, 0x6f, 0x6c, 0x6c, 0x65, 0x63, 0x74, 0x69, 0x6f, 0x6e, 0x73, 0x0a, 0x4f, 0x72, 0x64, 0x65,
    0x72, 0x65, 0x64, 0x44, 0x69, 0x63, 0x74, 0x0a, 0x71, 0x08, 0x29, 0x52, 0x71, 0x09, 0x74, 0x71,
    0x0a, 0x52, 0x71, 0x0b, 0x2e,
};
const uint8_t kLegacyVector[] = {
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, 0x80,
    0x02, 0x4d, 0xe9, 0x03, 0x2e, 0x80, 0x02, 0x7d, 0x71, 0x00, 0x28, 0x58, 0x10, 0x00, 0x00, 0x00,
    0x70, 0x72, 0x6f, 0x74, 0x6f, 0x63, 0x6f, 0x6c, 0x5f, 0x76, 0x65, 0x72, 0x73, 0x69, 0x6f, 0x6e,
    0x71, 0x01, 0x4d, 0xe9, 0x03, 0x58, 0x0d, 0x00, 0x00, 0x00, 0x6c, 0x69, 0x74, 0x74, 0x6c, 0x65,
    0x5f, 0x65, 0x6e, 0x64, 0x69, 0x61, 0x6e, 0x71, 0x02, 0x88, 0x58, 0x0a, 0x00, 0x00, 0x00, 0x74,
    0x79, 0x70, 0x65, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x73, 0x71, 0x03, 0x7d, 0x71, 0x04, 0x28, 0x58,
    0x05, 0x00, 0x00, 0x00, 0x73, 0x68, 0x6f, 0x72, 0x74, 0x71, 0x05, 0x4b, 0x02, 0x58, 0x03, 0x00,
    0x00, 0x00, 0x69, 0x6e, 0x74, 0x71, 0x06, 0x4b, 0x04, 0x58, 0x04, 0x00, 0x00, 0x00, 0x6c, 0x6f,
    0x6e, 0x67, 0x71, 0x07, 0x4b, 0x04, 0x75, 0x75, 0x2e, 0x80, 0x02, 0x63, 0x74, 0x6f, 0x72, 0x63,
    0x68, 0x2e, 0x5f, 0x75, 0x74, 0x69, 0x6c, 0x73, 0x0a, 0x5f, 0x72, 0x65, 0x62, 0x75, 0x69, 0x6c,
    0x64, 0x5f, 0x74, 0x65, 0x6e, 0x73, 0x6f, 0x72, 0x5f, 0x76, 0x32, 0x0a, 0x71, 0x00, 0x28, 0x28,
    0x58, 0x07, 0x00, 0x00, 0x00, 0x73, 0x74, 0x6f, 0x72, 0x61, 0x67, 0x65, 0x71, 0x01, 0x63, 0x74,
    0x6f, 0x72, 0x63, 0x68, 0x0a, 0x4c, 0x6f, 0x6e, 0x67, 0x53, 0x74, 0x6f, 0x72, 0x61, 0x67, 0x65,
    0x0a, 0x71, 0x02, 0x58, 0x0e, 0x00, 0x00, 0x00, 0x39, 0x34, 0x36, 0x39, 0x32, 0x36, 0x38, 0x32,
    0x34, 0x34, 0x37, 0x37, 0x37, 0x36, 0x71, 0x03, 0x58, 0x03, 0x00, 0x00, 0x00, 0x63, 0x70, 0x75,
    0x71, 0x04, 0x4b, 0x05, 0x4e, 0x74, 0x71, 0x05, 0x51, 0x4b, 0x00, 0x4b, 0x05, 0x85, 0x71, 0x06,
    0x4b, 0x01, 0x85, 0x71, 0x07, 0x89, 0x63, 0x63, 0x6f, 0x6c, 0x6c, 0x65, 0x63, 0x74, 0x69, 0x6f,
    0x6e, 0x73, 0x0a, 0x4f, 0x72, 0x64, 0x65, 0x72, 0x65, 0x64, 0x44, 0x69, 0x63, 0x74, 0x0a, 0x71,
    0x08, 0x29, 0x52, 0x71, 0x09, 0x74, 0x71, 0x0a, 0x52, 0x71, 0x0b, 0x2e, 0x80, 0x02, 0x5d, 0x71,
    0x00, 0x58, 0x0e, 0x00, 0x00, 0x00, 0x39, 0x34, 0x36, 0x39, 0x32, 0x36, 0x38, 0x32, 0x34, 0x34,
    0x37, 0x37, 0x37, 0x36, 0x71, 0x01, 0x61, 0x2e, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

using Body = std::function<void(const uint8_t*, size_t)>;

void RunBody(const Body& body, const std::vector<uint8_t>& input) {
  // A copy of exactly the input's size, so a sanitizer sees a read one byte past it.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[input.size() ? input.size() : 1]);
  if (!input.empty()) std::memcpy(copy.get(), input.data(), input.size());
  body(copy.get(), input.size());
}

// One to four random edits of the kinds that find bugs in parsers: bit flips, boundary values
// written over integers, truncation, erased / duplicated / inserted ranges.
void Mutate(std::vector<uint8_t>& v, std::mt19937_64& rng) {
  static const uint64_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fff, 0xffff, 0x7fffffff, 0x80000000,
                                          0xffffffff, 0x100000000ull, 0x7fffffffffffffffull,
                                          0x8000000000000000ull, ~0ull, 64, 4096};
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    if (v.empty()) {
      v.push_back(static_cast<uint8_t>(rng()));
      continue;
    }
    size_t at = rng() % v.size();
    switch (rng() % 7) {
      case 0: v[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
      case 1: v[at] = static_cast<uint8_t>(kInteresting[rng() % std::size(kInteresting)]); break;
      case 2: {
        uint64_t x = kInteresting[rng() % std::size(kInteresting)];
        size_t width = size_t{1} << (rng() % 4);
        for (size_t i = 0; i < width && at + i < v.size(); ++i) v[at + i] = static_cast<uint8_t>(x >> (8 * i));
        break;
      }
      case 3: v.resize(at); break;
      case 4: v.erase(v.begin() + at, v.begin() + std::min(v.size(), at + 1 + rng() % 64)); break;
      case 5: {
        size_t n = std::min(v.size() - at, size_t{1} + rng() % 64);
        std::vector<uint8_t> piece(v.begin() + at, v.begin() + at + n);
        v.insert(v.begin() + rng() % v.size(), piece.begin(), piece.end());
        break;
      }
      case 6: {
        size_t n = 1 + rng() % 16;
        for (size_t i = 0; i < n; ++i) v.insert(v.begin() + at, static_cast<uint8_t>(rng()));
        break;
      }
    }
  }
}

void MutationFuzz(const Body& body, const std::vector<std::vector<uint8_t>>& seeds, int iterations,
                  const std::function<void(std::vector<uint8_t>&, std::mt19937_64&)>& fixup = {}) {
  std::mt19937_64 rng(0x5eed);
  for (const auto& s : seeds) RunBody(body, s);
  RunBody(body, {});
  for (int i = 0; i < iterations; ++i) {
    std::vector<uint8_t> v = seeds[rng() % seeds.size()];
    Mutate(v, rng);
    if (fixup) fixup(v, rng);
    RunBody(body, v);
  }
}

std::vector<uint8_t> Bytes(const uint8_t* p, size_t n) { return std::vector<uint8_t>(p, p + n); }

// ---------------------------------------------------------------------------------------------

TEST(FuzzRegressions, ReplayCommittedInputs) {
  const std::vector<std::pair<std::string, Body>> targets = {
      {"fuzz_container", fuzz::FuzzContainer}, {"fuzz_pickle", fuzz::FuzzPickle}, {"fuzz_pt_archive", fuzz::FuzzPtArchive},
      {"fuzz_convert", fuzz::FuzzConvert}};
  int replayed = 0;
  for (const auto& [name, body] : targets) {
    fs::path dir = fs::path(testing::SourceRoot()) / "tests/fuzz/regressions" / name;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
      SCOPED_TRACE(e.path().string());
      RunBody(body, testing::ReadFileBytes(e.path().string()));
      ++replayed;
    }
  }
  std::printf("replayed %d committed fuzz inputs\n", replayed);
}

// A stand-in for libFuzzer's LLVMFuzzerMutate: Mutate() on the buffer, within max_size.
std::mt19937_64 g_byte_rng(0xb17e5);
size_t MutateBytes(uint8_t* data, size_t size, size_t max_size) {
  std::vector<uint8_t> v(data, data + size);
  Mutate(v, g_byte_rng);
  v.resize(std::min(v.size(), max_size));
  std::memcpy(data, v.data(), v.size());
  return v.size();
}

// fuzz_container's custom mutator applied to `v` as libFuzzer would (room for growth).
void CustomMutate(std::vector<uint8_t>& v, unsigned seed) {
  size_t size = v.size();
  v.resize(size + 4096);
  v.resize(fuzz::MutateContainer(v.data(), size, v.size(), seed, MutateBytes));
}

std::vector<std::vector<uint8_t>> ContainerSeeds(const TempDir& dir) {
  WriteSampleContainer(dir.File("a.zckpt"), 1, 5, 9000, 3);  // zstd and raw chunks, 4 KiB chunks
  WriteSampleContainer(dir.File("b.zckpt"), 2, 3, 200, 0);
  return {testing::ReadFileBytes(dir.File("a.zckpt")), testing::ReadFileBytes(dir.File("b.zckpt"))};
}

TEST(FuzzSmoke, ContainerMutations) {
  TempDir dir;
  MutationFuzz(fuzz::FuzzContainer, ContainerSeeds(dir), 4000, [](std::vector<uint8_t>& v, std::mt19937_64& rng) {
    if (rng() % 2) CustomMutate(v, static_cast<unsigned>(rng()));
  });
}

// The custom mutator does its job: most of its mutants pass every checksum (the superblock's, the
// index's, the chunks' and blobs'), so the fuzzer spends its time on the rules behind them; many
// open (the structural rules hold), and some of those are new valid files (verify finds nothing)
// that the rest of the target then reads.
TEST(FuzzSmoke, ContainerMutatorReachesPastTheChecksums) {
  TempDir dir;
  std::vector<std::vector<uint8_t>> seeds = ContainerSeeds(dir);
  std::mt19937_64 rng(11);
  int total = 0, opened = 0, checksums_pass = 0, clean = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::vector<uint8_t>& seed = seeds[rng() % seeds.size()];
    std::vector<uint8_t> v = seed;
    unsigned s = static_cast<unsigned>(rng());
    if (s % 16 == 0) continue;  // the byte-only eighth: not resealed on purpose
    CustomMutate(v, s);
    if (v == seed) continue;
    ++total;
    try {
      auto c = Container::OpenMemory(v.data(), v.size(), "m.zckpt");
      ++opened;
      VerifyReport r = c->Verify();
      bool checksum_problem = false;
      for (const auto& p : r.problems) checksum_problem |= p.message.find("checksum mismatch") != std::string::npos;
      checksums_pass += !checksum_problem;
      clean += r.ok();
    } catch (const Error& e) {
      checksums_pass += std::string(e.what()).find("checksum mismatch") == std::string::npos;
    }
    RunBody(fuzz::FuzzContainer, v);
  }
  std::printf("%d mutants: %d pass every checksum, %d open, %d verify clean\n", total, checksums_pass, opened, clean);
  EXPECT_GT(checksums_pass, total * 9 / 10);
  EXPECT_GT(opened, total / 5);
  EXPECT_GT(clean, total / 20);
}

TEST(FuzzSmoke, PickleMutations) {
  MutationFuzz(fuzz::FuzzPickle, {Bytes(kVectorPickle, sizeof kVectorPickle), Bytes(kLegacyVector, sizeof kLegacyVector)},
               20000);
}

// A torch.save-like archive of torch.arange(5) written by zckpt's own zip writer.
std::vector<uint8_t> VectorArchive(const TempDir& dir) {
  pt::TorchZipWriter w(dir.File("v.pt"), "v");
  w.WriteRecord("data.pkl", std::span<const uint8_t>(kVectorPickle, sizeof kVectorPickle));
  w.WriteRecord("byteorder", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>("little"), 6));
  std::vector<uint8_t> data(40);
  for (size_t i = 0; i < 5; ++i) data[8 * i] = static_cast<uint8_t>(i);
  w.WriteRecord("data/0", data);
  w.WriteRecord("version", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>("3\n"), 2));
  w.Commit();
  return testing::ReadFileBytes(dir.File("v.pt"));
}

TEST(FuzzSmoke, PtArchiveMutations) {
  TempDir dir;
  MutationFuzz(fuzz::FuzzPtArchive, {VectorArchive(dir)}, 20000);
}

TEST(FuzzSmoke, ConvertMutations) {
  TempDir dir;
  MutationFuzz(fuzz::FuzzConvert, {VectorArchive(dir), Bytes(kLegacyVector, sizeof kLegacyVector)}, 1500);
}


// ---------------------------------------------------------------------------------------------
// Named regressions.
// ---------------------------------------------------------------------------------------------

// A torch.save-style pickle of one tensor over a 5-element LongStorage (40 bytes) with the given
// sizes and strides (each element written as an 8-byte LONG1, so any int64 fits).
std::vector<uint8_t> TensorPickle(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                                  int64_t storage_offset = 0) {
  std::vector<uint8_t> p = {0x80, 0x02};
  auto text = [&](const std::string& s) { p.insert(p.end(), s.begin(), s.end()); };
  auto long8 = [&](int64_t v) {
    p.push_back(0x8a);
    p.push_back(8);
    for (int i = 0; i < 8; ++i) p.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
  };
  auto unicode = [&](const std::string& s) {
    p.push_back('X');
    for (int i = 0; i < 4; ++i) p.push_back(static_cast<uint8_t>(s.size() >> (8 * i)));
    text(s);
  };
  text("ctorch._utils\n_rebuild_tensor_v2\n(");
  text("(");  // persistent id ('storage', LongStorage, '0', 'cpu', 5)
  unicode("storage");
  text("ctorch\nLongStorage\n");
  unicode("0");
  unicode("cpu");
  text("K\x05tQ");
  long8(storage_offset);
  text("(");
  for (int64_t v : sizes) long8(v);
  text("t(");
  for (int64_t v : strides) long8(v);
  text("t\x89" "ccollections\nOrderedDict\n)RtR.");
  return p;
}

// A .pt archive whose pickle names storage data/0 that the archive lacks (fuzz_convert, CI run
// of 2026-11): convert refused it with kInvalidArgument, an error that blames the caller, as if
// zckpt had built a wrong record list. The file is what is damaged: kCorrupt, naming the record.
TEST(ConvertRegression, ArchiveMissingAStorageOfItsPickleIsCorrupt) {
  TempDir dir;
  {
    pt::TorchZipWriter w(dir.File("v.pt"), "v");
    w.WriteRecord("data.pkl", std::span<const uint8_t>(kVectorPickle, sizeof kVectorPickle));
    w.WriteRecord("byteorder", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>("little"), 6));
    w.WriteRecord("version", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>("3\n"), 2));
    w.Commit();
  }
  try {
    ConvertFile(dir.File("v.pt"), dir.File("v.zckpt"), ConvertOptions{});
    FAIL() << "converted an archive without the storage its pickle names";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("data/0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(testing::FileExists(dir.File("v.zckpt")));
}

// InterpretTorchPickle's extent check (pickle/torch_tensors.cc, PlaceInStorage) summed
// (size - 1) * stride over the dimensions in 128 bits without an overflow check: 16 dimensions
// of size 2^62 + 1 and stride 2^62 add up to exactly 2^128, which wrapped to 0, so a tensor of
// 2^992 elements "fit" a 40-byte storage. Found while writing fuzz_pickle's extent oracle (which
// flags it); fixed by an overflow check in that loop.
TEST(PickleRegression, TensorExtentOverflowIsRefused) {
  const int64_t big = int64_t{1} << 62;
  std::vector<uint8_t> bytes = TensorPickle(std::vector<int64_t>(16, big + 1), std::vector<int64_t>(16, big));
  pickle::UnpickleResult tree = pickle::Unpickle(bytes);
  try {
    pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
    ADD_FAILURE() << "a tensor of 16 dims of 2^62+1 elements was accepted over a 40-byte storage";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
  }
  // The sane neighbours still work: the same pickle with a tensor that fits.
  pickle::TorchPickle ok = pickle::InterpretTorchPickle(pickle::Unpickle(TensorPickle({5}, {1})));
  ASSERT_EQ(ok.tensors.size(), 1u);
  EXPECT_EQ(ok.tensors[0].shape, std::vector<int64_t>{5});
  // Largest extents just inside and just outside the storage.
  EXPECT_NO_THROW(pickle::InterpretTorchPickle(pickle::Unpickle(TensorPickle({2, 2}, {3, 1}, 0))));
  EXPECT_THROW(pickle::InterpretTorchPickle(pickle::Unpickle(TensorPickle({2, 2}, {3, 1}, 1))), Error);
  // Fed through the fuzz body too (it aborts on a broken invariant).
  RunBody(fuzz::FuzzPickle, TensorPickle({2, 2}, {3, 1}, 0));
  RunBody(fuzz::FuzzPickle, bytes);
}

// ---------------------------------------------------------------------------------------------
// Resource use of the torch.save interpretation on small hostile pickles.
// ---------------------------------------------------------------------------------------------

// Runs Unpickle + InterpretTorchPickle of `bytes` in a child process; returns "" when it ended
// (accepted or refused with an Error) within `seconds` using at most `max_rss_mb` of memory,
// else what it did instead.
// This process's resident set now, in MiB (0 when /proc is unavailable).
long ResidentMb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return kb / 1024;
}

std::string InterpretBounded(const std::vector<uint8_t>& bytes, double seconds, long max_rss_mb) {
  std::fflush(nullptr);
  // A forked child starts with this process's resident pages counted in its own peak: the bound
  // is on what the interpretation adds (under ASan the suites before this one leave ~0.5 GB of
  // quarantine and shadow behind).
  const long inherited_mb = ResidentMb();
  pid_t pid = fork();
  if (pid == 0) {
#ifndef ZCKPT_UNDER_ASAN
    // Outside ASan (whose shadow memory needs a huge address space) an address-space cap turns a
    // runaway allocation into bad_alloc instead of swapping the machine.
    rlimit lim{rlim_t(max_rss_mb + 512) << 20, rlim_t(max_rss_mb + 512) << 20};
    setrlimit(RLIMIT_AS, &lim);
#endif
    try {
      pickle::InterpretTorchPickle(pickle::Unpickle(bytes));
    } catch (const Error&) {
    } catch (const std::bad_alloc&) {
      _exit(3);
    }
    _exit(0);
  }
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  rusage usage{};
  while (true) {
    pid_t r = wait4(pid, &status, WNOHANG, &usage);
    if (r == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      return "still running after " + std::to_string(seconds) + " s (killed)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long rss_mb = usage.ru_maxrss / 1024 - inherited_mb;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) return "ran out of memory (bad_alloc) after " + std::to_string(took) + " s";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "child ended with status " + std::to_string(status);
  if (rss_mb > max_rss_mb)
    return "peak RSS " + std::to_string(rss_mb) + " MB > " + std::to_string(max_rss_mb) + " MB (took " + std::to_string(took) + " s)";
  return "";
}

// A dict key of `key_bytes` bytes, stored once and reused through the memo, at every level of
// a chain of `depth` nested dicts (what Python's pickle writes for {K: {K: {K: ...}}}).
std::vector<uint8_t> DeepSharedKeyPickle(size_t key_bytes, int depth) {
  std::vector<uint8_t> p = {0x80, 0x02};
  // Outside-in: EMPTY_DICT and the key per level, the innermost value, then one SETITEM per
  // level on the way back out.
  for (int d = 0; d < depth; ++d) {
    p.push_back('}');  // EMPTY_DICT
    if (d == 0) {
      p.push_back('X');
      for (int i = 0; i < 4; ++i) p.push_back(static_cast<uint8_t>(key_bytes >> (8 * i)));
      p.insert(p.end(), key_bytes, 'k');
      p.insert(p.end(), {'q', 0});  // BINPUT 0
    } else {
      p.insert(p.end(), {'h', 0});  // BINGET 0
    }
  }
  p.push_back('N');  // the innermost value
  for (int d = 0; d < depth; ++d) p.push_back('s');  // SETITEM
  p.push_back('.');
  return p;
}

// One dict whose `entries` entries all use the same `key_bytes`-byte key through the memo.
std::vector<uint8_t> WideSharedKeyPickle(size_t key_bytes, int entries) {
  std::vector<uint8_t> p = {0x80, 0x02, '}', '(', 'X'};
  for (int i = 0; i < 4; ++i) p.push_back(static_cast<uint8_t>(key_bytes >> (8 * i)));
  p.insert(p.end(), key_bytes, 'k');
  p.insert(p.end(), {'q', 0, 'N'});
  for (int i = 1; i < entries; ++i) p.insert(p.end(), {'h', 0, 'N'});
  p.insert(p.end(), {'u', '.'});
  return p;
}

// The walk of pickle/torch_model.cc used to build the full dotted path of every node it pushed,
// as a std::string per frame, before knowing whether the node held a tensor. A key stored once
// and reused through the memo then cost its length again at every level and for every sibling:
// this 70 KB pickle (a 64 KiB key at 990 nested levels) took ~32 GB of string copies (minutes),
// and this 115 KB one (16384 entries sharing a 64 KiB key) held 1.6 GB of paths at once, so a
// small hostile .pt hung or OOM-killed `zckpt convert` (Unpickle's max_total_bytes counts the
// key once). Found by the hardening review; fixed by the pickle layer (lazy tensor paths, 0c82d83).
TEST(PickleResources, SharedLongKeysDoNotBlowUpPaths) {
  const std::vector<uint8_t> deep = DeepSharedKeyPickle(64 << 10, 990);
  const std::vector<uint8_t> wide = WideSharedKeyPickle(64 << 10, 16384);
  std::printf("deep pickle %zu bytes, wide pickle %zu bytes\n", deep.size(), wide.size());
  std::string why = InterpretBounded(deep, 10, 512);
  EXPECT_EQ(why, "") << "deep chain sharing one 64 KiB key (" << deep.size() << " bytes): " << why;
  why = InterpretBounded(wide, 10, 512);
  EXPECT_EQ(why, "") << "16384 dict entries sharing one 64 KiB key (" << wide.size() << " bytes): " << why;
}

}  // namespace
}  // namespace zckpt::hardening
