// The records of the torch.save zip archive a checkpoint would have been, made by torch's own
// zip writer (caffe2::serialize::PyTorchStreamWriter) so the records it adds on its own at the
// end (version, .data/serialization_id, byteorder when missing) are exactly torch's.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace zckpt::save {

// The archive's records other than the storages, as torch's zip writer makes them.
struct ArchiveRecords {
  std::vector<std::string> before;           // data.pkl, then the leading records, in order
  std::vector<std::string> after;            // what the writer adds at its end (version, ...)
  std::map<std::string, std::string> bytes;  // every one of them (data.pkl included)
};

// data.pkl, then `leading` (the records torch.save writes before the storages); the storages go
// between `before` and `after` (save_pickled.h). Only the small records go through an in-memory
// archive of a few hundred bytes plus the pickle.
ArchiveRecords MakeArchiveRecords(const std::string& pickle,
                                  const std::vector<std::pair<std::string, std::string>>& leading);

}  // namespace zckpt::save
