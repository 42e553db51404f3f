/* zckpt.h: the C interface of libzckpt_core.so, zckpt's torch-free core (the library the
 * `zckpt` Python package loads with ctypes, in the wheel beside its .py files).
 *
 * C, not C++: one library serves every Python and any language with a C FFI. Nothing is thrown
 * across it. Every call that can fail returns a zckpt_status and, when `error` is not NULL and
 * the call failed, sets *error to a description the caller frees with zckpt_error_free (on
 * success *error is left as it was).
 *
 * Objects the core keeps (an open checkpoint, a host buffer, a writer, a mapped storage) are
 * opaque handles: a struct holding a number, passed by value, each kind its own type. A handle
 * stays valid until its own release call (zckpt_close, zckpt_host_buffer_free,
 * zckpt_mapped_release, zckpt_writer_close); a released handle, or one of another kind, is
 * refused with ZCKPT_ERROR_INVALID_ARGUMENT, never used. Handles are process-wide and
 * thread-safe; calls on one writer must not overlap.
 *
 * The typed calls move bytes: open and close, host buffers, byte ranges loaded by address,
 * mapped storages, the container writer. Calls whose answer is a document (describe, tensor
 * records, verify reports, merge plans, convert and export) go through zckpt_call, one JSON
 * request in, one JSON document out.
 *
 * Sizes and thread counts in option structs: 0 means the default, chosen by the core (see
 * docs/benchmarks.md "Loader defaults"). A NULL options pointer means every default.
 */
#ifndef ZCKPT_ZCKPT_H_
#define ZCKPT_ZCKPT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The interface's version. A program built against version N runs with a library whose
 * zckpt_abi_version() returns N; any change to a call, struct or number here raises it. */
#define ZCKPT_ABI_VERSION 1u
uint32_t zckpt_abi_version(void);

/* What every call returns. The numbers are pinned: never renumbered, never reused. The error
 * kinds are include/zckpt/error.h's ErrorKind, in its order; zckpt_status_name gives each the
 * name the command line and the Python package use ("io", "not-a-container", ...). */
typedef enum zckpt_status {
  ZCKPT_OK = 0,
  ZCKPT_ERROR_IO = 1,               /* open/read/write/mmap/fsync failed */
  ZCKPT_ERROR_NOT_A_CONTAINER = 2,  /* not a .zckpt file */
  ZCKPT_ERROR_CORRUPT = 3,          /* damaged or forged: a checksum or the structure fails */
  ZCKPT_ERROR_UNSUPPORTED = 4,      /* valid, but a version or feature this build lacks */
  ZCKPT_ERROR_UNSAFE = 5,           /* a pickle names a global outside the allowlist */
  ZCKPT_ERROR_INVALID_ARGUMENT = 6, /* the caller's mistake: a bad option, range or handle */
  ZCKPT_ERROR_CANCELLED = 7,        /* stopped on request */
  ZCKPT_ERROR_OUT_OF_MEMORY = 8,    /* a device or pinned allocation failed */
  ZCKPT_ERROR_HOST_MEMORY = 9,      /* the core's own host allocation failed */
  ZCKPT_ERROR_INTERNAL = 10         /* a defect of zckpt's: please report it */
} zckpt_status;

/* "ok", the kind's name, "memory", "internal"; "unknown" for a number not listed above. */
const char* zckpt_status_name(int status);

typedef struct zckpt_error zckpt_error;
zckpt_status zckpt_error_status(const zckpt_error* error);
/* The message: names the file, storage, tensor and byte range where it is about one. */
const char* zckpt_error_message(const zckpt_error* error);
/* Where the error lies, as JSON: {"file", "storage", "tensors", "chunk", "file_bytes",
 * "storage_bytes"}, each null when the error is not about it (byte ranges as [begin, end)). */
const char* zckpt_error_place(const zckpt_error* error);
void zckpt_error_free(zckpt_error* error);

/* ---- Handles ---- */
typedef struct zckpt_checkpoint { uint64_t id; } zckpt_checkpoint;
typedef struct zckpt_host_buffer { uint64_t id; } zckpt_host_buffer;
typedef struct zckpt_mapped { uint64_t id; } zckpt_mapped;
typedef struct zckpt_writer { uint64_t id; } zckpt_writer;

/* ---- Checkpoints ---- */

/* Opens a .zckpt file (or an object URL) and checks its index. Everything later read from it
 * comes through this one open file. */
zckpt_status zckpt_open(const char* path, zckpt_checkpoint* checkpoint, zckpt_error** error);
zckpt_status zckpt_close(zckpt_checkpoint checkpoint, zckpt_error** error);
zckpt_status zckpt_storage_count(zckpt_checkpoint checkpoint, uint64_t* count, zckpt_error** error);

/* ---- Host buffers ---- */

/* Host memory a load fills: 4 KiB-aligned (bytes not in the page cache go straight from the
 * disk into it), at *address until freed. Zero-filled is not promised. */
zckpt_status zckpt_host_buffer_new(uint64_t bytes, zckpt_host_buffer* buffer, void** address, zckpt_error** error);
zckpt_status zckpt_host_buffer_free(zckpt_host_buffer buffer, zckpt_error** error);

/* ---- Loading byte ranges ---- */

/* Raw bytes [begin, end) of storage `storage` (its index in the file) into `address`: host
 * memory when device is -1, else memory of that CUDA device. 40 bytes, no padding. */
typedef struct zckpt_range {
  uint64_t storage;
  uint64_t begin;
  uint64_t end;
  void* address;
  int64_t device;
} zckpt_range;

/* The stream a CUDA device's copies wait for (a cudaStream_t; NULL: the legacy default stream). */
typedef struct zckpt_device_stream {
  int64_t device;
  void* stream;
} zckpt_device_stream;

typedef struct zckpt_load_options {
  uint32_t verify;      /* nonzero: every chunk read is checked against its XXH3 first */
  uint32_t threads;     /* reader threads; 0: the default */
  uint32_t slots;       /* ring slots; 0: the default */
  uint32_t reserved;    /* 0 */
  uint64_t slot_bytes;  /* bytes per ring slot; 0: the default */
} zckpt_load_options;

typedef struct zckpt_load_stats {
  uint64_t raw_bytes;       /* bytes delivered into destinations (decoded) */
  uint64_t stored_bytes;    /* bytes of chunks read from the file */
  uint64_t chunks;          /* chunks read */
  uint64_t uncached_bytes;  /* bytes read with O_DIRECT (not in the page cache) */
  uint64_t storages;        /* storages touched */
  uint32_t threads;         /* reader threads run */
  uint32_t verified;        /* 1 when every chunk read was checked */
  double seconds;           /* wall time of the load */
} zckpt_load_stats;

/* Fills every range in one streaming pass: only the chunks the ranges touch are read. Ranges may
 * overlap each other in the file; destinations must not overlap. `streams` names the stream of
 * each CUDA device a range goes to (NULL when there is none); `options` NULL: defaults, verify
 * on; `stats` may be NULL. A range outside its storage is ZCKPT_ERROR_INVALID_ARGUMENT naming
 * it, before anything is read. */
zckpt_status zckpt_load_ranges(zckpt_checkpoint checkpoint, const zckpt_range* ranges, size_t range_count,
                               const zckpt_device_stream* streams, size_t stream_count,
                               const zckpt_load_options* options, zckpt_load_stats* stats, zckpt_error** error);

/* ---- Mapped storages ---- */

/* One storage as the file's mapping holds it (raw chunks alias the file; zstd ones are decoded
 * into memory of their own): `bytes` at `data`, valid while `keeper` is held, after the
 * checkpoint is closed too. Storage keys are describe's, in the same order. */
typedef struct zckpt_mapped_storage {
  void* data;
  uint64_t bytes;
  zckpt_mapped keeper;
} zckpt_mapped_storage;

/* Every storage of the file, in file order, into storages[0 .. zckpt_storage_count); `count` must
 * be that count. With verify nonzero, every chunk is hashed where it lies first, on `threads`
 * threads (0: the default). Each storage's keeper is released with zckpt_mapped_release. */
zckpt_status zckpt_map_storages(zckpt_checkpoint checkpoint, uint32_t verify, uint32_t threads,
                                zckpt_mapped_storage* storages, size_t count, zckpt_error** error);
zckpt_status zckpt_mapped_release(zckpt_mapped keeper, zckpt_error** error);

/* ---- Writing a container ---- */

typedef struct zckpt_writer_options {
  uint64_t chunk_bytes; /* raw bytes per chunk; 0: the default */
  int32_t zstd_level;   /* 0: chunks stored raw; 1..22: zstd at that level where it saves bytes */
  uint32_t threads;     /* hashing/compressing threads; 0: the default */
} zckpt_writer_options;

/* A tensor written whole or in pieces: one storage `key` holding its elements in row-major order
 * and a record `name` viewing all of it. `dtype` is torch's name without "torch." ("bfloat16");
 * `extra` a JSON text or ""; `location` the device it was saved from ("cpu", "cuda:0"). */
typedef struct zckpt_tensor_spec {
  const char* key;
  const char* name;
  const char* dtype;
  const int64_t* shape;
  size_t ndim;
  const char* extra;
  const char* location;
} zckpt_tensor_spec;

typedef struct zckpt_write_stats {
  uint64_t storages;
  uint64_t chunks;
  uint64_t raw_bytes;
  uint64_t file_bytes;
} zckpt_write_stats;

/* Nothing is at `path` until zckpt_writer_commit; a writer closed before that leaves nothing. */
zckpt_status zckpt_writer_open(const char* path, const zckpt_writer_options* options, zckpt_writer* writer,
                               zckpt_error** error);
/* A contiguous tensor whole; `bytes` must be its shape's. The bytes are read before it returns. */
zckpt_status zckpt_writer_add_tensor(zckpt_writer writer, const zckpt_tensor_spec* tensor, const void* data,
                                     uint64_t bytes, zckpt_error** error);
/* A tensor in pieces: begin, append until `bytes` are given, end. One at a time. */
zckpt_status zckpt_writer_begin_tensor(zckpt_writer writer, const zckpt_tensor_spec* tensor, uint64_t bytes,
                                       zckpt_error** error);
zckpt_status zckpt_writer_append(zckpt_writer writer, const void* data, uint64_t bytes, zckpt_error** error);
zckpt_status zckpt_writer_end_tensor(zckpt_writer writer, zckpt_error** error);
zckpt_status zckpt_writer_add_blob(zckpt_writer writer, const char* name, const void* data, uint64_t bytes,
                                   zckpt_error** error);
zckpt_status zckpt_writer_set_metadata(zckpt_writer writer, const char* key, const char* value, zckpt_error** error);
/* Writes the index, syncs and renames the file into place; `stats` may be NULL. */
zckpt_status zckpt_writer_commit(zckpt_writer writer, zckpt_write_stats* stats, zckpt_error** error);
zckpt_status zckpt_writer_close(zckpt_writer writer, zckpt_error** error);

/* ---- Documents: JSON in, JSON out ---- */

/* request: UTF-8 JSON {"call": NAME, "args": {...}}, every argument given; bytes go in by address
 * ({"$address": a, "$bytes": n}, alive for the call), handles as {"$handle": id}. The result
 * holds {"value": V} or {"error": {"kind", "message", and the place's fields}}; V names returned
 * byte strings as {"$bytes": i}. NULL only when no memory was left for the result itself. */
typedef struct zckpt_result zckpt_result;
zckpt_result* zckpt_call(const char* request, size_t length);
const char* zckpt_result_json(const zckpt_result* result, size_t* length);
const char* zckpt_result_bytes(const zckpt_result* result, size_t i, size_t* length);
void zckpt_result_free(zckpt_result* result);

#ifdef __cplusplus
}
#endif

#endif /* ZCKPT_ZCKPT_H_ */
