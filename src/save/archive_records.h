// The records of the torch.save zip archive a checkpoint would have been, made by torch's own
// zip writer (caffe2::serialize::PyTorchStreamWriter) so the records it adds on its own at the
// end (version, .data/serialization_id, byteorder when missing) are exactly torch's.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace zckpt::save {

struct ArchiveRecords {
  std::vector<std::string> names;            // archive order, prefix excluded
  std::map<std::string, std::string> bytes;  // every record but the storages (data.pkl included)
};

// The record prefix torch.save(obj, path) writes: the file's base name without its last
// extension (c10's basename), "archive" where torch writes through a stream (a path that is not
// ASCII) or the stem is empty.
std::string ArchivePrefix(const std::string& path);

// data.pkl, then `leading` (the records torch.save writes before the storages), then
// `data/<key>` for each of `storage_keys`, then whatever torch's writer adds at its end of file.
// The storages' bytes are not written anywhere (only the small records go through an in-memory
// archive of a few hundred bytes plus the pickle).
ArchiveRecords MakeArchiveRecords(const std::string& pickle,
                                  const std::vector<std::pair<std::string, std::string>>& leading,
                                  const std::vector<std::string>& storage_keys);

}  // namespace zckpt::save
