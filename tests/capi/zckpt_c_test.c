/* libzckpt_core.so as a C program uses it: only <zckpt/zckpt.h> and the library. Writes a
 * container with the typed writer, loads byte ranges and maps storages back, and holds the
 * interface to its contract: pinned statuses and names, an unknown call, a malformed request, a
 * handle of another kind, a double release and a call after close are each refused with
 * ZCKPT_ERROR_INVALID_ARGUMENT and a message, never a crash.
 *
 *   zckpt_c_test DIR   (DIR: a writable folder)
 *
 * Prints `ok NAME` or `FAIL NAME: why` per check (tools/ci/torch-matrix.sh counts them); exits 1
 * when any failed. Built by meson against the build's library (tests/capi/meson.build) and by
 * torch-matrix.sh against the wheel's installed header and library. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zckpt/zckpt.h>

static int failures = 0;

static void check(int ok, const char* name, const char* why) {
  if (ok) {
    printf("ok c-api %s\n", name);
  } else {
    printf("FAIL c-api %s: %s\n", name, why);
    ++failures;
  }
}

/* A call expected to fail with `want`: the status, and an error naming it with a message. */
static void check_refused(zckpt_status got, zckpt_error* error, zckpt_status want, const char* name) {
  char why[512];
  if (got != want) {
    snprintf(why, sizeof why, "status %d (%s), want %d (%s)%s%s", (int)got, zckpt_status_name(got), (int)want,
             zckpt_status_name(want), error ? ": " : "", error ? zckpt_error_message(error) : "");
    check(0, name, why);
  } else if (!error || zckpt_error_status(error) != want || zckpt_error_message(error)[0] == '\0') {
    check(0, name, "no error, or one without its status and message");
  } else {
    check(1, name, "");
  }
  if (error) zckpt_error_free(error);
}

/* A call made with &error that must fail with `want`; evaluated before its error is read. */
#define EXPECT_REFUSED(want, name, call) \
  do {                                    \
    error = NULL;                         \
    zckpt_status got_ = (call);           \
    check_refused(got_, error, want, name); \
    error = NULL;                         \
  } while (0)

/* The JSON document of a zckpt_call, copied out (freed by the caller). */
static char* call_json(const char* request) {
  zckpt_result* r = zckpt_call(request, strlen(request));
  size_t n = 0;
  const char* text = zckpt_result_json(r, &n);
  char* copy = malloc(n + 1);
  memcpy(copy, text, n);
  copy[n] = '\0';
  zckpt_result_free(r);
  return copy;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/c_api.zckpt", argv[1]);
  zckpt_error* error = NULL;

  check(zckpt_abi_version() == ZCKPT_ABI_VERSION, "abi-version", "the library's version is not the header's");
  check(strcmp(zckpt_status_name(ZCKPT_OK), "ok") == 0 && strcmp(zckpt_status_name(ZCKPT_ERROR_IO), "io") == 0 &&
            strcmp(zckpt_status_name(ZCKPT_ERROR_NOT_A_CONTAINER), "not-a-container") == 0 &&
            strcmp(zckpt_status_name(3), "corrupt") == 0 && strcmp(zckpt_status_name(4), "unsupported") == 0 &&
            strcmp(zckpt_status_name(5), "unsafe") == 0 && strcmp(zckpt_status_name(6), "invalid-argument") == 0 &&
            strcmp(zckpt_status_name(7), "cancelled") == 0 && strcmp(zckpt_status_name(8), "out-of-memory") == 0 &&
            strcmp(zckpt_status_name(9), "memory") == 0 && strcmp(zckpt_status_name(10), "internal") == 0 &&
            strcmp(zckpt_status_name(11), "unknown") == 0,
        "status-names", "a status number's name moved");

  /* A container of two tensors: one whole, one in pieces, a blob and metadata. */
  enum { kN = 1000 };
  static float a[kN], b[kN];
  for (int i = 0; i < kN; ++i) a[i] = (float)i, b[i] = (float)(2 * i + 1);
  int64_t shape_a[1] = {kN}, shape_b[2] = {10, kN / 10};
  zckpt_writer w;
  zckpt_writer_options wo = {4096, 0, 1};
  zckpt_tensor_spec ta = {"0", "a", "float32", shape_a, 1, "", "cpu"};
  zckpt_tensor_spec tb = {"1", "b", "float32", shape_b, 2, "", "cpu"};
  zckpt_write_stats ws;
  int wrote = zckpt_writer_open(path, &wo, &w, &error) == ZCKPT_OK &&
              zckpt_writer_add_tensor(w, &ta, a, sizeof a, &error) == ZCKPT_OK &&
              zckpt_writer_begin_tensor(w, &tb, sizeof b, &error) == ZCKPT_OK &&
              zckpt_writer_append(w, b, sizeof b / 2, &error) == ZCKPT_OK &&
              zckpt_writer_append(w, (const char*)b + sizeof b / 2, sizeof b / 2, &error) == ZCKPT_OK &&
              zckpt_writer_end_tensor(w, &error) == ZCKPT_OK &&
              zckpt_writer_add_blob(w, "note", "hi", 2, &error) == ZCKPT_OK &&
              zckpt_writer_set_metadata(w, "written_by", "zckpt_c_test", &error) == ZCKPT_OK &&
              zckpt_writer_commit(w, &ws, &error) == ZCKPT_OK;
  check(wrote && ws.storages == 2 && ws.raw_bytes == sizeof a + sizeof b, "write", error ? zckpt_error_message(error) : "stats");
  if (error) zckpt_error_free(error), error = NULL;
  check(zckpt_writer_close(w, NULL) == ZCKPT_OK, "writer-close", "closing a committed writer failed");
  {
    zckpt_tensor_spec bad = {"2", "c", "float32", shape_a, 1, "", "cpu"};
    zckpt_writer w2;
    char p2[4200];
    snprintf(p2, sizeof p2, "%s/never.zckpt", argv[1]);
    zckpt_writer_open(p2, NULL, &w2, NULL);
    EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "writer-bytes-not-shape", zckpt_writer_add_tensor(w2, &bad, a, 12, &error));
    zckpt_writer_close(w2, NULL);
    FILE* f = fopen(p2, "rb");
    check(f == NULL, "writer-closed-uncommitted-leaves-nothing", "a file is at the path");
    if (f) fclose(f);
  }

  /* Loads: byte ranges into a host buffer, the storages mapped. */
  zckpt_checkpoint c;
  check(zckpt_open(path, &c, &error) == ZCKPT_OK, "open", error ? zckpt_error_message(error) : "");
  uint64_t count = 0;
  check(zckpt_storage_count(c, &count, NULL) == ZCKPT_OK && count == 2, "storage-count", "not 2 storages");
  zckpt_host_buffer hb;
  void* address = NULL;
  check(zckpt_host_buffer_new(sizeof a + sizeof b, &hb, &address, NULL) == ZCKPT_OK && address &&
            ((uintptr_t)address % 4096) == 0,
        "host-buffer", "no 4 KiB-aligned buffer");
  zckpt_range ranges[3] = {
      {0, 0, sizeof a, address, -1},
      {1, 0, sizeof b / 2, (char*)address + sizeof a, -1},
      {1, sizeof b / 2, sizeof b, (char*)address + sizeof a + sizeof b / 2, -1},
  };
  zckpt_load_options lo = {1, 2, 0, 0, 0};
  zckpt_load_stats ls;
  zckpt_status st = zckpt_load_ranges(c, ranges, 3, NULL, 0, &lo, &ls, &error);
  check(st == ZCKPT_OK && memcmp(address, a, sizeof a) == 0 && memcmp((char*)address + sizeof a, b, sizeof b) == 0 &&
            ls.raw_bytes == sizeof a + sizeof b && ls.verified == 1,
        "load-ranges", error ? zckpt_error_message(error) : "the bytes or the stats differ");
  if (error) zckpt_error_free(error), error = NULL;
  zckpt_range outside = {0, 0, sizeof a + 4, address, -1};
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "load-range-outside-its-storage",
                 zckpt_load_ranges(c, &outside, 1, NULL, 0, NULL, NULL, &error));

  zckpt_mapped_storage mapped[2];
  st = zckpt_map_storages(c, 1, 0, mapped, 2, &error);
  check(st == ZCKPT_OK && mapped[0].bytes == sizeof a && memcmp(mapped[0].data, a, sizeof a) == 0 &&
            memcmp(mapped[1].data, b, sizeof b) == 0,
        "map-storages", error ? zckpt_error_message(error) : "the mapped bytes differ");
  if (error) zckpt_error_free(error), error = NULL;
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "map-storages-wrong-count",
                 zckpt_map_storages(c, 0, 0, mapped, 1, &error));

  /* A document: describe, with the checkpoint's handle. */
  char request[256];
  snprintf(request, sizeof request, "{\"call\": \"describe\", \"args\": {\"checkpoint\": {\"$handle\": %llu}}}",
           (unsigned long long)c.id);
  char* doc = call_json(request);
  check(strstr(doc, "\"written_by\":\"zckpt_c_test\"") != NULL, "describe", doc);
  free(doc);

  /* The contract. */
  doc = call_json("{\"call\": \"no_such_call\", \"args\": {}}");
  check(strstr(doc, "\"kind\":\"invalid-argument\"") && strstr(doc, "no call 'no_such_call'"), "unknown-call", doc);
  free(doc);
  doc = call_json("{\"call\": \"describe\", \"args\": ");
  check(strstr(doc, "\"kind\":\"invalid-argument\"") && strstr(doc, "malformed request"), "malformed-request", doc);
  free(doc);
  doc = call_json("{\"call\": \"describe\", \"args\": {\"checkpoint\": 7}}");
  check(strstr(doc, "\"kind\":\"invalid-argument\"") != NULL, "request-argument-of-wrong-type", doc);
  free(doc);

  zckpt_checkpoint not_a_checkpoint = {hb.id};
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "handle-of-another-kind",
                 zckpt_load_ranges(not_a_checkpoint, ranges, 1, NULL, 0, NULL, NULL, &error));
  zckpt_host_buffer not_a_buffer = {c.id};
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "release-as-another-kind", zckpt_host_buffer_free(not_a_buffer, &error));
  check(zckpt_mapped_release(mapped[0].keeper, NULL) == ZCKPT_OK && zckpt_mapped_release(mapped[1].keeper, NULL) == ZCKPT_OK,
        "mapped-release", "releasing a mapped storage failed");
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "mapped-double-release",
                 zckpt_mapped_release(mapped[0].keeper, &error));
  check(zckpt_close(c, NULL) == ZCKPT_OK, "close", "closing failed");
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "double-close",
                 zckpt_close(c, &error));
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "call-after-close",
                 zckpt_load_ranges(c, ranges, 1, NULL, 0, NULL, NULL, &error));
  check(zckpt_host_buffer_free(hb, NULL) == ZCKPT_OK, "host-buffer-free", "freeing failed");
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "host-buffer-double-free",
                 zckpt_host_buffer_free(hb, &error));
  check(zckpt_close(c, NULL) == ZCKPT_ERROR_INVALID_ARGUMENT, "error-pointer-may-be-null", "not refused without one");

  /* A flipped byte in the first tensor's bytes: corrupt, the place naming the file and chunk. */
  {
    FILE* f = fopen(path, "r+b");
    static char file[1 << 16];
    size_t n = f ? fread(file, 1, sizeof file, f) : 0;
    long at = -1;
    for (size_t i = 0; i + sizeof a <= n && at < 0; ++i)
      if (memcmp(file + i, a, sizeof a) == 0) at = (long)i + 100;
    if (at >= 0) {
      file[at] ^= 1;
      fseek(f, at, SEEK_SET);
      fputc(file[at], f);
    }
    if (f) fclose(f);
    check(at >= 0, "find-payload", "the first tensor's bytes are not in the file");
    zckpt_checkpoint bad;
    void* dst = malloc(sizeof a);
    zckpt_range r = {0, 0, sizeof a, dst, -1};
    error = NULL;
    st = zckpt_open(path, &bad, NULL);
    if (st == ZCKPT_OK) st = zckpt_load_ranges(bad, &r, 1, NULL, 0, NULL, NULL, &error);
    check(st == ZCKPT_ERROR_CORRUPT && error && strstr(zckpt_error_place(error), path) &&
              strstr(zckpt_error_place(error), "\"chunk\":0"),
          "corrupt-byte-place", error ? zckpt_error_place(error) : zckpt_status_name(st));
    if (error) zckpt_error_free(error), error = NULL;
    zckpt_close(bad, NULL);
    free(dst);
  }

  char missing[4200];
  snprintf(missing, sizeof missing, "%s/missing.zckpt", argv[1]);
  EXPECT_REFUSED(ZCKPT_ERROR_IO, "open-missing-file",
                 zckpt_open(missing, &c, &error));
  EXPECT_REFUSED(ZCKPT_ERROR_INVALID_ARGUMENT, "open-null-path", zckpt_open(NULL, &c, &error));
  return failures ? 1 : 0;
}
