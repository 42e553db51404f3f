#include "save/archive_records.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>

#include <memory>

#include "zckpt/error.h"

namespace zckpt::save {

ArchiveRecords MakeArchiveRecords(const std::string& pickle,
                                  const std::vector<std::pair<std::string, std::string>>& leading) {
  const std::string object_pickle = "data.pkl";
  ArchiveRecords out;
  std::string zip;
  try {
    {
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
        zip.append(static_cast<const char*>(data), n);
        return n;
      });
      writer.writeRecord(object_pickle, pickle.data(), pickle.size());
      for (const auto& [name, bytes] : leading) writer.writeRecord(name, bytes.data(), bytes.size());
      writer.writeEndOfFile();
    }
    caffe2::serialize::PyTorchStreamReader reader(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(zip.data(), static_cast<off_t>(zip.size())));
    std::vector<std::string> written = reader.getAllRecords();
    for (const std::string& name : written) {
      auto [data, size] = reader.getRecord(name);
      out.bytes[name].assign(static_cast<const char*>(data.get()), size);
    }
    // What we wrote comes first, in order; the storages follow it (torch.save writes them last,
    // just before the end of file), then the writer's own end records.
    const size_t ours = 1 + leading.size();
    if (written.size() < ours || written[0] != object_pickle)
      throw Error(ErrorKind::kIo, "torch's zip writer did not keep the records in the order written");
    out.before.assign(written.begin(), written.begin() + static_cast<std::ptrdiff_t>(ours));
    out.after.assign(written.begin() + static_cast<std::ptrdiff_t>(ours), written.end());
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kInvalidArgument, std::string("torch's zip writer: ") + e.what_without_backtrace());
  }
  return out;
}

}  // namespace zckpt::save
