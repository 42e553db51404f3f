// S3Config from the environment and the AWS shared config/credentials files.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "remote/s3.h"
#include "zckpt/error.h"

namespace zckpt::remote {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// An INI file as the AWS tools write it: section -> key -> value ("" when unreadable).
using Ini = std::map<std::string, std::map<std::string, std::string>>;
Ini ReadIni(const std::string& path) {
  Ini ini;
  std::ifstream in(path);
  std::string line, section;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(line.substr(1, line.size() - 2));
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    ini[section][Trim(line.substr(0, eq))] = Trim(line.substr(eq + 1));
  }
  return ini;
}

std::string HomeFile(const char* env, const char* rel) {
  std::string p = Env(env);
  if (!p.empty()) return p;
  std::string home = Env("HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

template <typename T>
T Number(const char* name, T fallback) {
  std::string v = Env(name);
  if (v.empty()) return fallback;
  try {
    return static_cast<T>(std::stod(v));
  } catch (...) {
    throw Error(ErrorKind::kInvalidArgument, std::string(name) + "=" + v + ": not a number");
  }
}

}  // namespace

S3Config LoadS3Config() {
  S3Config c;
  std::string profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  Ini creds = ReadIni(HomeFile("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
  Ini config = ReadIni(HomeFile("AWS_CONFIG_FILE", ".aws/config"));
  // ~/.aws/config names profiles "[profile NAME]", except "[default]".
  auto& conf = config[profile == "default" ? "default" : "profile " + profile];
  auto setting = [&](const char* key) {
    auto& cr = creds[profile];
    if (auto it = cr.find(key); it != cr.end()) return it->second;
    if (auto it = conf.find(key); it != conf.end()) return it->second;
    return std::string();
  };

  c.access_key = Env("AWS_ACCESS_KEY_ID");
  c.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  c.session_token = Env("AWS_SESSION_TOKEN");
  if (c.access_key.empty()) {
    c.access_key = setting("aws_access_key_id");
    c.secret_key = setting("aws_secret_access_key");
    c.session_token = setting("aws_session_token");
  }
  for (const char* v : {"AWS_REGION", "AWS_DEFAULT_REGION"})
    if (c.region = Env(v); !c.region.empty()) break;
  if (c.region.empty()) c.region = setting("region");
  if (c.region.empty()) c.region = "us-east-1";
  for (const char* v : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
    if (c.endpoint = Env(v); !c.endpoint.empty()) break;
  if (c.endpoint.empty()) c.endpoint = setting("endpoint_url");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  // A custom endpoint (MinIO, Ceph, moto, ...) is addressed path-style; AWS virtual-host style.
  c.path_style = !c.endpoint.empty();
  std::string style = Env("ZCKPT_S3_ADDRESSING");
  if (style == "path") c.path_style = true;
  else if (style == "virtual") c.path_style = false;
  else if (!style.empty())
    throw Error(ErrorKind::kInvalidArgument, "ZCKPT_S3_ADDRESSING=" + style + ": expected path or virtual");
  c.attempts = std::max(1u, Number<unsigned>("ZCKPT_S3_ATTEMPTS", c.attempts));
  c.backoff_s = Number<double>("ZCKPT_S3_BACKOFF", c.backoff_s);
  c.timeout_s = std::max(1L, Number<long>("ZCKPT_S3_TIMEOUT", c.timeout_s));
  c.connections = std::max(1u, Number<unsigned>("ZCKPT_S3_CONNECTIONS", c.connections));
  c.get_bytes = static_cast<uint64_t>(std::max(0.0625, Number<double>("ZCKPT_S3_GET_MB", static_cast<double>(c.get_bytes) / (1 << 20))) * (1 << 20));
  c.uploads = std::max(1u, Number<unsigned>("ZCKPT_S3_UPLOADS", c.uploads));
  c.part_bytes = std::max<uint64_t>(5, Number<uint64_t>("ZCKPT_S3_PART_MB", c.part_bytes >> 20)) << 20;
  c.stale_upload_s = std::max(0L, Number<long>("ZCKPT_S3_STALE_UPLOAD_S", c.stale_upload_s));
  return c;
}

}  // namespace zckpt::remote
