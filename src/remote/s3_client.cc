#include "remote/s3_client.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "remote/s3_pool.h"
#include "zckpt/error.h"

namespace zckpt::remote {

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One easy handle per thread: libcurl keeps its connections alive between requests.
struct ThreadHandle {
  CURL* h = nullptr;
  ThreadHandle() {
    GlobalInit();
    h = curl_easy_init();
  }
  ~ThreadHandle() {
    if (h) curl_easy_cleanup(h);
  }
};

// The CA certificates HTTPS is checked against: the file a user names (the first of these
// variables set), else libcurl's compiled-in bundle (Debian's libcurl has one), else the first of
// kCaBundles that exists. The wheel's static libcurl is built without one, since the path differs
// by distribution.
constexpr const char* kCaBundleVariables[] = {"ZCKPT_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"};
constexpr const char* kCaBundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",  // Debian, Ubuntu, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",    // RHEL, Fedora, Amazon Linux
    "/etc/ssl/ca-bundle.pem",              // SUSE
    "/etc/pki/tls/cacert.pem",             // OpenELEC
    "/etc/ssl/cert.pem",                   // Alpine, macOS-style layouts
};

// The bundle to give CURLOPT_CAINFO; "" to leave libcurl's own.
const std::string& CaBundle(CURL* h) {
  static const std::string bundle = [h] {
    for (const char* var : kCaBundleVariables)
      if (const char* v = std::getenv(var); v && *v) return std::string(v);
    char* builtin = nullptr;
    if (curl_easy_getinfo(h, CURLINFO_CAINFO, &builtin) == CURLE_OK && builtin && *builtin) return std::string();
    for (const char* path : kCaBundles)
      if (access(path, R_OK) == 0) return std::string(path);
    return std::string();
  }();
  return bundle;
}

CURL* Handle() {
  thread_local ThreadHandle t;
  if (!t.h) throw Error(ErrorKind::kOutOfMemory, "curl_easy_init failed");
  curl_easy_reset(t.h);
  return t.h;
}

struct Transfer {
  const Request* req;
  Response* resp;
  CURL* h;
  uint64_t sent = 0;
  size_t piece = 0;  // the first scatter piece not yet filled
};

// Body bytes [from, from + len) at p into the request's scatter pieces that hold them.
void Scatter(Transfer* t, const char* p, uint64_t from, uint64_t len) {
  const std::vector<Request::Piece>& pieces = t->req->scatter;
  for (; t->piece < pieces.size(); ++t->piece) {
    const Request::Piece& s = pieces[t->piece];
    if (s.at >= from + len) return;
    uint64_t lo = std::max(s.at, from), hi = std::min(s.at + s.n, from + len);
    if (hi > lo) std::memcpy(s.dst + (lo - s.at), p + (lo - from), hi - lo);
    if (s.at + s.n > from + len) return;  // the rest of this piece comes later
  }
}

size_t OnBody(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
  if (status / 100 == 2 && (t->req->sink || !t->req->scatter.empty())) {
    // More than asked for: a server that ignored the range. Stop (the transfer fails).
    if (len > t->req->sink_bytes - t->resp->received) return 0;
    if (t->req->sink) std::memcpy(t->req->sink + t->resp->received, p, len);
    else Scatter(t, p, t->resp->received, len);
    t->resp->received += len;
    RequestPool::CountBytes(len);
    return len;
  }
  size_t cap = t->req->max_body;
  if (t->resp->body.size() < cap) t->resp->body.append(p, std::min(len, cap - t->resp->body.size()));
  return len;
}

size_t OnHeader(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
  std::string line(p, len);
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string v = line.substr(colon + 1);
    size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t\r\n");
    v = b == std::string::npos ? "" : v.substr(b, e - b + 1);
    if (name == "etag") t->resp->etag = v;
    // "bytes 0-99/1234": the object's size after the slash (a ranged GET answers what a HEAD would).
    if (name == "content-range" && v.rfind('/') != std::string::npos && v.back() != '*')
      t->resp->object_size = static_cast<int64_t>(std::strtoull(v.c_str() + v.rfind('/') + 1, nullptr, 10));
  }
  return len;
}

size_t OnUpload(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = std::min<uint64_t>(size * n, t->req->upload_bytes - t->sent);
  std::memcpy(p, t->req->upload + t->sent, len);
  t->sent += len;
  RequestPool::CountBytes(len);
  return len;
}

}  // namespace

std::string PercentEncode(const std::string& v, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : v) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/')) {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  return out;
}

std::string Advice(const Response& r) {
  std::string code = XmlValue(r.body, "Code");
  if (code == "InvalidToken" || code == "ExpiredToken" || code == "TokenRefreshRequired")
    return " (check AWS_SESSION_TOKEN: temporary credentials need the token they were issued with)";
  if (r.status == 401 || r.status == 403)
    return " (check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE and ~/.aws/credentials)";
  if (r.status == 404) return code == "NoSuchBucket" ? " (no such bucket)" : " (no such bucket or key)";
  if (r.status == 301 || r.status == 400) return " (check AWS_REGION and AWS_ENDPOINT_URL)";
  if (r.status == 0) return " (check the endpoint: AWS_ENDPOINT_URL or the profile's endpoint_url, and that it is reachable)";
  return "";
}

std::string XmlValue(const std::string& xml, const std::string& tag) {
  size_t b = xml.find("<" + tag + ">");
  if (b == std::string::npos) return "";
  b += tag.size() + 2;
  size_t e = xml.find("</" + tag + ">", b);
  return e == std::string::npos ? "" : xml.substr(b, e - b);
}

// XML text with its five entities and numeric references decoded (keys may hold '&', '<').
std::string XmlUnescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string::npos) throw Error(ErrorKind::kIo, "S3 reply: bad XML entity");
    std::string e = s.substr(i + 1, semi - i - 1);
    if (e == "amp") out += '&';
    else if (e == "lt") out += '<';
    else if (e == "gt") out += '>';
    else if (e == "quot") out += '"';
    else if (e == "apos") out += '\'';
    else if (!e.empty() && e[0] == '#') {
      unsigned long cp = e.size() > 1 && (e[1] == 'x' || e[1] == 'X') ? std::strtoul(e.c_str() + 2, nullptr, 16)
                                                                      : std::strtoul(e.c_str() + 1, nullptr, 10);
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else {
      throw Error(ErrorKind::kIo, "S3 reply: unknown XML entity &" + e + ";");
    }
    i = semi;
  }
  return out;
}

bool Response::transient() const {
  if (curl_code != CURLE_OK) return true;
  if (status >= 500 || status == 429) return true;
  return false;
}

std::string Response::Describe() const {
  if (curl_code != CURLE_OK) return curl_error;
  std::string s = "HTTP " + std::to_string(status);
  std::string code = XmlValue(body, "Code"), msg = XmlValue(body, "Message");
  if (!code.empty()) s += " " + code;
  if (!msg.empty()) s += ": " + msg;
  return s;
}

S3Client::S3Client(S3Config config) : config_(std::move(config)) {}

std::string S3Client::Url(const std::string& bucket, const std::string& key, const std::string& query) const {
  std::string url;
  std::string ek = PercentEncode(key, /*keep_slash=*/true);
  if (config_.path_style) {
    std::string ep = config_.endpoint.empty() ? "https://s3." + config_.region + ".amazonaws.com" : config_.endpoint;
    url = ep + "/" + bucket + (ek.empty() ? "" : "/" + ek);
  } else if (config_.endpoint.empty()) {
    url = "https://" + bucket + ".s3." + config_.region + ".amazonaws.com/" + ek;
  } else {
    size_t scheme = config_.endpoint.find("://");
    size_t host = scheme == std::string::npos ? 0 : scheme + 3;
    url = config_.endpoint.substr(0, host) + bucket + "." + config_.endpoint.substr(host) + "/" + ek;
  }
  if (!query.empty()) url += "?" + query;
  return url;
}

Response S3Client::Perform(const Request& r) const {
  Response resp;
  CURL* h = Handle();
  Transfer t{&r, &resp, h};
  std::string url = Url(r.bucket, r.key, r.query);
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  if (const std::string& ca = CaBundle(h); !ca.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, ca.c_str());
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, config_.connect_timeout_s);
  // A server that stops sending: under 1 byte/s for timeout_s fails the attempt (no hang).
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, config_.timeout_s);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  std::string sigv4 = "aws:amz:" + config_.region + ":s3";
  std::string userpwd = config_.access_key + ":" + config_.secret_key;
  if (!config_.access_key.empty()) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERPWD, userpwd.c_str());
  }
  curl_slist* headers = nullptr;
  std::vector<std::string> hs = r.headers;
  if (!config_.session_token.empty()) hs.push_back("x-amz-security-token: " + config_.session_token);
  // The payload is not hashed into the signature (S3 accepts this over TLS; bodies are
  // checksummed by zckpt itself).
  hs.push_back("x-amz-content-sha256: UNSIGNED-PAYLOAD");
  // No "Expect:" here to turn 100-continue off: libcurl signs every header it is given, an
  // empty one too, and then leaves the empty one out of the request, so the server's signature
  // differs (SignatureDoesNotMatch on every request). The Expect libcurl adds itself to a large
  // upload is added after signing and unsigned headers are allowed.
  if (r.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, OnUpload);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.upload_bytes));
    if (r.method == "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  for (const std::string& s : hs) headers = curl_slist_append(headers, s.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(headers);
  resp.curl_code = rc;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
  curl_off_t cl = -1;
  if (curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) == CURLE_OK) resp.content_length = cl;
  if (rc != CURLE_OK) resp.curl_error = std::string(curl_easy_strerror(rc)) + (errbuf[0] ? std::string(": ") + errbuf : "");
  return resp;
}

void S3Client::Backoff(unsigned retry) const {
  // Jitter from a splitmix64 step (8 bytes of TLS: the libraries are loaded with dlopen into
  // processes whose static TLS is nearly full, so no std::mt19937 here).
  thread_local uint64_t state = 0;
  if (state == 0) state = std::random_device{}() | 1;
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  double wait = std::min(5.0, config_.backoff_s * static_cast<double>(1u << std::min(retry - 1, 10u)));
  wait *= 0.5 + 0.5 * static_cast<double>(z >> 11) / static_cast<double>(1ull << 53);
  std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

Response S3Client::PerformRetrying(const Request& r, const std::function<bool(const Response&)>& ok) const {
  Response resp;
  for (unsigned attempt = 1;; ++attempt) {
    resp = Perform(r);
    bool short_body = resp.curl_code == 0 && resp.status / 100 == 2 && ok && !ok(resp);
    if (!resp.transient() && !short_body) return resp;
    if (short_body) {
      resp.curl_code = CURLE_PARTIAL_FILE;
      resp.curl_error = "short response: " + std::to_string(resp.received) + " of " + std::to_string(r.sink_bytes) + " bytes";
    }
    if (attempt >= config_.attempts) return resp;
    Backoff(attempt);
  }
}

}  // namespace zckpt::remote
