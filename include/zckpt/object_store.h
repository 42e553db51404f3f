// Containers in S3-compatible object storage: `s3://BUCKET/KEY` is taken wherever a container
// path is (Container::Open, Load, LoadInto, Verify, `zckpt ls/verify/load`) and as a destination
// (ContainerWriter: zckpt.save, `zckpt convert -o`), configured from the AWS environment
// variables and shared files (src/remote/README.md).
#pragma once

#include <string>
#include <string_view>

namespace zckpt {

// True for an object URL ("s3://...").
bool IsObjectUrl(std::string_view path);
// True when the object exists (HEAD answers 2xx), false when it does not (404); Error(kIo)
// naming the URL for anything else (wrong credentials, unreachable endpoint).
bool ObjectExists(const std::string& url);

}  // namespace zckpt
