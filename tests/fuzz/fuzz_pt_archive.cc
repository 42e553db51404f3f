// fuzz_pt_archive: the strict zip reader and torch's archive conventions on arbitrary bytes.
//
// DetectPtFormat on the head; ZipArchive over a MappedFile wrapping the input (every entry:
// Find, Data, VerifyCrc); TorchArchive over the same mapping (every record: FindRecord, Record,
// StorageRecord for data/<key>, VerifyCrc). Besides crashes and sanitizer reports it checks what
// the readers promise: payload views lie inside the input, entry names are unique and found,
// records belong to the archive's entries, and data.pkl is always there.
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>

#include "common/mapped_file.h"
#include "fuzz_target.h"
#include "pt/pt_archive.h"
#include "pt/pt_format.h"
#include "pt/zip_reader.h"
#include "zckpt/error.h"

namespace zckpt::fuzz {

namespace {

bool Inside(const uint8_t* base, size_t size, std::span<const uint8_t> s) {
  if (s.empty()) return true;
  if (s.data() < base) return false;
  uint64_t off = static_cast<uint64_t>(s.data() - base);
  return off <= size && s.size() <= size - off;
}

void CheckEntryData(const pt::ZipArchive& zip, const pt::ZipEntry& e, const uint8_t* data, size_t size) {
  ZCKPT_FUZZ_CHECK(e.data_offset <= size && e.compressed_size <= size - e.data_offset);
  ZCKPT_FUZZ_CHECK(e.local_header_offset < e.data_offset);
  ZCKPT_FUZZ_CHECK(!pt::PrintableEntryName(e.name).empty() || e.name.empty());
  try {
    std::span<const uint8_t> payload = zip.Data(e);
    ZCKPT_FUZZ_CHECK(e.method == 0);
    ZCKPT_FUZZ_CHECK(payload.size() == e.uncompressed_size && Inside(data, size, payload));
    pt::CrcCheck crc = zip.VerifyCrc(e);
    if (crc.status == pt::CrcCheck::Status::kMatch) ZCKPT_FUZZ_CHECK(crc.recorded == crc.computed);
  } catch (const Error& err) {
    ZCKPT_FUZZ_CHECK(err.kind() == ErrorKind::kUnsupported || err.kind() == ErrorKind::kCorrupt);
  }
}

}  // namespace

void FuzzPtArchive(const uint8_t* data, size_t size) {
  (void)pt::PtFormatName(pt::DetectPtFormat(std::span<const uint8_t>(data, std::min(size, pt::kPtFormatProbeBytes))));
  auto file = std::make_shared<const MappedFile>(data, size, "fuzz.pt");

  try {
    pt::ZipArchive zip(file);
    std::unordered_set<std::string> names;
    for (const pt::ZipEntry& e : zip.entries()) {
      ZCKPT_FUZZ_CHECK(names.insert(e.name).second);  // unique
      const pt::ZipEntry* found = zip.Find(e.name);
      ZCKPT_FUZZ_CHECK(found == &e);
      CheckEntryData(zip, e, data, size);
    }
    ZCKPT_FUZZ_CHECK(zip.central_directory_offset() <= size &&
                     zip.central_directory_size() <= size - zip.central_directory_offset());
  } catch (const Error&) {
  }

  try {
    pt::TorchArchive archive(file);
    const auto& entries = archive.zip().entries();
    ZCKPT_FUZZ_CHECK(archive.FindRecord("data.pkl") != nullptr);
    ZCKPT_FUZZ_CHECK(archive.RecordNames().size() == archive.records().size());
    for (const pt::TorchRecord& r : archive.records()) {
      ZCKPT_FUZZ_CHECK(r.entry >= entries.data() && r.entry < entries.data() + entries.size());
      ZCKPT_FUZZ_CHECK(archive.FindRecord(r.name) == &r);
      try {
        std::span<const uint8_t> bytes = archive.Record(r.name);
        ZCKPT_FUZZ_CHECK(Inside(data, size, bytes));
        if (pt::TorchArchive::IsStorageRecord(r.name)) {
          std::span<const uint8_t> s = archive.StorageRecord(std::string_view(r.name).substr(5));
          ZCKPT_FUZZ_CHECK(s.data() == bytes.data() && s.size() == bytes.size());
        }
        (void)archive.zip().VerifyCrc(*r.entry);
      } catch (const Error& err) {
        ZCKPT_FUZZ_CHECK(err.kind() == ErrorKind::kUnsupported || err.kind() == ErrorKind::kCorrupt);
      }
    }
    try {
      (void)archive.Record("no such record \xff");
      ZCKPT_FUZZ_CHECK(archive.FindRecord("no such record \xff") != nullptr);
    } catch (const Error& err) {
      ZCKPT_FUZZ_CHECK(err.kind() == ErrorKind::kCorrupt || err.kind() == ErrorKind::kUnsupported);
    }
  } catch (const Error&) {
  }
}

}  // namespace zckpt::fuzz

ZCKPT_FUZZ_ENTRY(zckpt::fuzz::FuzzPtArchive)
