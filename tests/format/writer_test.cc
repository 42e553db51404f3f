// Writer refusals and failures: bad options and arguments (kInvalidArgument), write errors
// (kIo), and in every case no file at the destination and no temporary file left behind.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "common/atomic_file.h"
#include "format_test_util.h"
#include "test_util.h"

namespace zckpt::testing {
namespace {

// Runs `body` on a fresh writer and expects it to throw `kind`; the folder must be empty after.
void ExpectWriterError(ErrorKind kind, const std::string& needle, const std::function<void(ContainerWriter&)>& body,
                       const WriterOptions& options = {}) {
  TempDir dir;
  try {
    ContainerWriter w(dir.File("out.zckpt"), options);
    body(w);
    w.Commit();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{});
}

TEST(Writer, RefusesBadOptions) {
  auto with = [](auto set) {
    WriterOptions o;
    set(o);
    return o;
  };
  auto nothing = [](ContainerWriter&) {};
  ExpectWriterError(ErrorKind::kInvalidArgument, "chunk_bytes", nothing, with([](auto& o) { o.chunk_bytes = 1000; }));
  ExpectWriterError(ErrorKind::kInvalidArgument, "chunk_bytes", nothing,
                    with([](auto& o) { o.chunk_bytes = (1ull << 30) + 4096; }));
  ExpectWriterError(ErrorKind::kInvalidArgument, "large_alignment", nothing,
                    with([](auto& o) { o.large_alignment = 3000; }));
  ExpectWriterError(ErrorKind::kInvalidArgument, "small_alignment", nothing,
                    with([](auto& o) { o.small_alignment = 8192; }));
  ExpectWriterError(ErrorKind::kInvalidArgument, "zstd_level", nothing, with([](auto& o) { o.zstd_level = 99; }));
  ExpectWriterError(ErrorKind::kInvalidArgument, "zstd_level", nothing, with([](auto& o) { o.zstd_level = -1; }));
}

TEST(Writer, RefusesDuplicates) {
  ExpectWriterError(ErrorKind::kInvalidArgument, "duplicate storage key 'a'", [](ContainerWriter& w) {
    w.AddStorage({"a"}, {});
    w.AddStorage({"a"}, {});
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "duplicate tensor name 't'", [](ContainerWriter& w) {
    w.AddStorage({"a"}, RandomBytes(4, 1));
    w.AddTensor(Tensor("t", 0, DType::kUInt8, {1}, {1}));
    w.AddTensor(Tensor("t", 0, DType::kUInt8, {1}, {1}));
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "duplicate blob name 'data.pkl'", [](ContainerWriter& w) {
    w.AddBlob("data.pkl", RandomBytes(4, 1));
    w.AddBlob("data.pkl", {});
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "duplicate metadata key 'k'", [](ContainerWriter& w) {
    w.SetMetadata("k", "1");
    w.SetMetadata("k", "2");
  });
}

TEST(Writer, RefusesBadStorages) {
  ExpectWriterError(ErrorKind::kInvalidArgument, "invalid dtype",
                    [](ContainerWriter& w) { w.AddStorage({"a", "cpu", DType::kInvalid}, {}); });
  ExpectWriterError(ErrorKind::kInvalidArgument, "invalid dtype",
                    [](ContainerWriter& w) { w.AddStorage({"a", "cpu", static_cast<DType>(kMaxDTypeCode + 1)}, {}); });
  ExpectWriterError(ErrorKind::kInvalidArgument, "not a multiple", [](ContainerWriter& w) {
    w.AddStorage({"a", "cpu", DType::kFloat32}, RandomBytes(6, 1));
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "untyped", [](ContainerWriter& w) {
    w.AddStorage({"a", "cpu", DType::kFloat32, true}, {});
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "more than its 4 bytes", [](ContainerWriter& w) {
    w.BeginStorage({"a"}, 4);
    w.AppendStorage(RandomBytes(3, 1));
    w.AppendStorage(RandomBytes(2, 1));
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "ended after 3 of its 4 bytes", [](ContainerWriter& w) {
    w.BeginStorage({"a"}, 4);
    w.AppendStorage(RandomBytes(3, 1));
    w.EndStorage();
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "is open", [](ContainerWriter& w) {
    w.BeginStorage({"a"}, 4);
    w.AddBlob("b", RandomBytes(3, 1));
  });
  ExpectWriterError(ErrorKind::kInvalidArgument, "is open", [](ContainerWriter& w) { w.BeginStorage({"a"}, 4); });
  ExpectWriterError(ErrorKind::kInvalidArgument, "without BeginStorage",
                    [](ContainerWriter& w) { w.AppendStorage(RandomBytes(3, 1)); });
  ExpectWriterError(ErrorKind::kInvalidArgument, "without BeginStorage", [](ContainerWriter& w) { w.EndStorage(); });
}

TEST(Writer, ValidatesTensorsAtCommit) {
  auto tensor_case = [](const std::string& needle, NewTensor t) {
    ExpectWriterError(ErrorKind::kInvalidArgument, needle, [&](ContainerWriter& w) {
      w.AddStorage({"a", "cpu", DType::kFloat32}, RandomBytes(24, 1));
      w.AddTensor(t);
    });
  };
  tensor_case("storage 1 does not exist", Tensor("t", 1, DType::kFloat32, {1}, {1}));
  tensor_case("invalid dtype", Tensor("t", 0, DType::kInvalid, {1}, {1}));
  tensor_case("shape and stride", Tensor("t", 0, DType::kFloat32, {1, 2}, {1}));
  tensor_case("more than 64", Tensor("t", 0, DType::kFloat32, std::vector<int64_t>(65, 1), std::vector<int64_t>(65, 1)));
  tensor_case("negative size", Tensor("t", 0, DType::kFloat32, {-1}, {1}));
  tensor_case("negative stride", Tensor("t", 0, DType::kFloat32, {2}, {-1}));
  tensor_case("past the end of storage 'a'", Tensor("t", 0, DType::kFloat32, {2, 3}, {3, 1}, 1));
  tensor_case("past the end", Tensor("t", 0, DType::kFloat64, {4}, {1}));
  tensor_case("overflows", Tensor("t", 0, DType::kFloat32, {2}, {int64_t{1} << 62}));
  tensor_case("unknown flags", Tensor("t", 0, DType::kFloat32, {1}, {1}, 0, 1u << 20));
  // At the limit: accepted.
  TempDir dir;
  ContainerWriter w(dir.File("ok.zckpt"));
  w.AddStorage({"a", "cpu", DType::kFloat32}, RandomBytes(24, 1));
  w.AddTensor(Tensor("t", 0, DType::kFloat32, {2, 3}, {3, 1}));
  w.AddTensor(Tensor("u", 0, DType::kFloat32, {0}, {1}, 1000));  // empty: offset is free
  w.AddTensor(Tensor("v", 0, DType::kFloat32, std::vector<int64_t>(64, 1), std::vector<int64_t>(64, 0), 5));
  w.Commit();
  EXPECT_EQ(Container::Open(dir.File("ok.zckpt"))->tensor_count(), 3u);
}

TEST(Writer, FailedWriterRefusesFurtherCalls) {
  TempDir dir;
  ContainerWriter w(dir.File("x.zckpt"));
  w.SetMetadata("k", "v");
  EXPECT_THROW(w.SetMetadata("k", "v"), Error);
  try {
    w.AddBlob("b", {});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos);
  }
  EXPECT_THROW(w.Commit(), Error);
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{});
}

TEST(Writer, CommitTwiceRefused) {
  TempDir dir;
  ContainerWriter w(dir.File("x.zckpt"));
  w.Commit();
  EXPECT_THROW(w.Commit(), Error);
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{"x.zckpt"});
}

TEST(Writer, DestroyedBeforeCommitLeavesNothing) {
  TempDir dir;
  {
    WriterOptions o;
    o.threads = 4;
    o.zstd_level = 1;
    ContainerWriter w(dir.File("x.zckpt"), o);
    w.AddStorage({"a"}, PatternBytes(20 << 20));
    w.BeginStorage({"b"}, 100);
  }
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{});
}

TEST(Writer, DestinationUntouchedOnFailure) {
  TempDir dir;
  std::string path = dir.File("x.zckpt");
  WriteFileBytes(path, {1, 2, 3});
  {
    ContainerWriter w(path);
    w.AddStorage({"a"}, RandomBytes(10, 1));
    w.AddTensor(Tensor("t", 3, DType::kUInt8, {1}, {1}));
    EXPECT_THROW(w.Commit(), Error);
  }
  EXPECT_EQ(ReadFileBytes(path), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{"x.zckpt"});
}

// An I/O error at any write(2) of a multi-MiB container: kIo, no destination, no temporary.
TEST(Writer, WriteErrorsAreIoAndLeaveNothing) {
  auto data = RandomBytes(5 << 20, 3);
  for (int fail_at = 1; fail_at <= 12; ++fail_at) {
    SCOPED_TRACE(fail_at);
    TempDir dir;
    bool failed = false;
    SetAtomicFileFailAfterWrites(fail_at);
    try {
      WriterOptions o;
      o.chunk_bytes = 1 << 20;
      o.threads = 2;
      ContainerWriter w(dir.File("x.zckpt"), o);
      w.AddStorage({"a"}, data);
      w.AddBlob("data.pkl", RandomBytes(100, 1));
      w.Commit();
    } catch (const Error& e) {
      failed = true;
      EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    }
    SetAtomicFileFailAfterWrites(0);
    if (!failed) {  // fewer writes than fail_at: the file must be complete and valid
      EXPECT_GE(fail_at, 3);
      EXPECT_TRUE(Container::Open(dir.File("x.zckpt"))->Verify().ok());
      break;
    }
    EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{});
  }
}

// AddStorage of a large storage reads the caller's bytes in place from worker threads; when a
// write fails half-way, no worker may touch them once AddStorage has thrown. The bytes live in
// their own mapping, unmapped at once: a worker still compressing them (zstd 12 on 1 MiB chunks
// keeps them busy) would crash the test (it does, without ChunkPipeline::Abandon).
TEST(Writer, FailedAddStorageReleasesTheCallersBytes) {
  const size_t size = 8 << 20;
  auto random = RandomBytes(size, 4);
  for (int fail_at = 1; fail_at <= 2; ++fail_at) {
    SCOPED_TRACE(fail_at);
    TempDir dir;
    WriterOptions o;
    o.chunk_bytes = 1 << 20;
    o.zstd_level = 12;
    o.threads = 4;
    std::optional<ContainerWriter> w;
    w.emplace(dir.File("x.zckpt"), o);
    void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    std::memcpy(mem, random.data(), size);
    bool failed = false;
    SetAtomicFileFailAfterWrites(fail_at);
    try {
      w->AddStorage({"a"}, std::span<const uint8_t>(static_cast<const uint8_t*>(mem), size));
    } catch (const Error& e) {
      failed = true;
      EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    }
    SetAtomicFileFailAfterWrites(0);
    ASSERT_EQ(::munmap(mem, size), 0);  // the caller has its bytes back
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(failed);
    EXPECT_THROW(w->Commit(), Error);
    w.reset();
    EXPECT_EQ(ListDir(dir.path()), std::vector<std::string>{});
  }
}

TEST(Writer, StatsAddUp) {
  TempDir dir;
  WriterOptions o;
  o.chunk_bytes = 4096;
  o.zstd_level = 5;
  ContainerWriter w(dir.File("x.zckpt"), o);
  w.AddStorage({"a"}, PatternBytes(3 * 4096));
  w.AddStorage({"b"}, RandomBytes(4096 + 1, 2));
  w.AddStorage({"c"}, {});
  WriterStats s = w.Commit();
  EXPECT_EQ(s.storages, 3u);
  EXPECT_EQ(s.chunks, 5u);
  EXPECT_EQ(s.compressed_chunks, 3u);
  EXPECT_EQ(s.raw_bytes, 4u * 4096 + 1);
  EXPECT_LT(s.stored_bytes, 4096u + 1 + 3 * 200);
  EXPECT_EQ(s.file_bytes, ReadFileBytes(dir.File("x.zckpt")).size());
  EXPECT_EQ(w.destination(), dir.File("x.zckpt"));
}

// Spec §9: writers write the lowest version that holds what they write. bcomplex32 (code 47)
// first exists in 1.1, whether a storage or only a tensor view over untyped bytes uses it (as
// torch.save writes it); the superblock, written first, is rewritten at commit.
TEST(Writer, MinorVersionIsTheLowestThatHoldsTheDtypes) {
  TempDir dir;
  auto minor_of = [&](const std::string& name, const std::function<void(ContainerWriter&)>& fill) {
    ContainerWriter w(dir.File(name));
    fill(w);
    w.Commit();
    auto c = Container::Open(dir.File(name));
    EXPECT_EQ(c->footer().minor, c->superblock().minor) << name;
    EXPECT_TRUE(c->Verify().ok()) << name;
    return c->superblock().minor;
  };
  EXPECT_EQ(minor_of("old.zckpt", [](ContainerWriter& w) {
              w.AddStorage({"s", "cpu", DType::kComplex32}, RandomBytes(16, 1));
              w.AddTensor(Tensor("t", 0, DType::kInt7, {16}, {1}));
            }), 0);
  EXPECT_EQ(minor_of("view.zckpt", [](ContainerWriter& w) {
              w.AddStorage({"s", "cpu", DType::kUInt8, /*untyped=*/true}, RandomBytes(16, 2));
              w.AddTensor(Tensor("t", 0, DType::kBComplex32, {4}, {1}));
            }), 1);
  EXPECT_EQ(minor_of("storage.zckpt", [](ContainerWriter& w) {
              w.AddStorage({"s", "cpu", DType::kBComplex32}, RandomBytes(16, 3));
            }), 1);
}

}  // namespace
}  // namespace zckpt::testing
