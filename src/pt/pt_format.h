// Telling which of torch's file formats a file is from its first bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace zckpt::pt {

enum class PtFormat {
  kUnknown,    // not a torch.save file at all
  kZip,        // torch >= 1.6: a zip archive (starts PK\3\4)
  kLegacy,     // torch < 1.6 or _use_new_zipfile_serialization=False: pickles + raw storages
  kLegacyTar,  // torch <= 0.3: a tar archive of pickles
};

const char* PtFormatName(PtFormat format);

// How many leading bytes DetectPtFormat looks at, at most (the tar magic sits at 257..261).
inline constexpr size_t kPtFormatProbeBytes = 512;

// Classifies a file by its first bytes (pass at least kPtFormatProbeBytes when the file has
// them). Never throws; kUnknown for anything else, including a too-short prefix.
PtFormat DetectPtFormat(std::span<const uint8_t> head);

}  // namespace zckpt::pt
