"""An S3-compatible server on 127.0.0.1 that answers the way object storage does, for loopback
tests and benchmarks (issue 34): a settable time to first byte, a per-connection throughput cap
and a link cap shared by all connections, on downloads and uploads alike.

It answers, path-style (http://127.0.0.1:PORT/BUCKET/KEY, or the absolute form AWS's CRT sends),
without checking signatures (any Authorization is accepted):
  HEAD and GET of an object, with Range (bytes=A-B, A-, -N; 206 and Content-Range; 416 past the
  end), ETag, If-Match (412 when it differs) and If-None-Match (304);
  ListObjectsV2 (prefix, delimiter, max-keys, start-after, continuation-token);
  PutObject; multipart uploads: CreateMultipartUpload, UploadPart, CompleteMultipartUpload (parts
  in order, ETags checked, all but the last at least min_part_bytes), AbortMultipartUpload and
  ListMultipartUploads; DeleteObject; CreateBucket (PUT /BUCKET).
Request bodies may be sent with Content-Length or chunked, and in aws-chunked encoding (boto3's
default checksums). Objects live in memory (uploaded or put) or are local files served in place
(serve_file: no copy). Errors are S3's XML (<Error><Code>NoSuchKey</Code>...).

Shaping (Shaping; all off by default; S3_LIKE is 30 ms, 25 MiB/s a connection, 320 MiB/s the link):
  ttfb_s    every request waits this long after its headers before anything else happens;
  conn_bps  each TCP connection's bytes/s (a token bucket of its own, both directions);
  link_bps  all connections' bytes/s together (one token bucket every body passes through).
Bodies move in 128 KiB pieces, each paid for in the connection's bucket and then the link's.

Counters (stats(), zeroed by reset_stats()): requests in flight and their peak since the reset,
requests by operation, connections that made an S3 request, bytes served (bodies out) and received (bodies in).

Everything is bounded: it listens on 127.0.0.1 only; a connection idle for `idle_timeout_s` is
closed; request bodies over `max_body_bytes` are refused. In process (ShapingServer) its threads
are daemons and close() (or the end of the process) stops it; as a process of its own
(ServerProcess, or `python shaping_server.py`, which prints its URL on its first line) it stops
when its stdin closes (the parent ended) or after --max-seconds.

The admin requests under /_shaping/ (not a valid bucket name) are neither shaped nor counted:
GET stats, POST reset, PUT shaping (JSON), PUT file (JSON {bucket, key, path}: serve a local file),
GET digest?bucket=B&key=K (size, sha256 and ETag of a stored object). The client side of those
and of a few plain S3 requests is S3Requests, shared with the moto helper of the tests."""
import argparse
import base64
import bisect
import dataclasses
import email.utils
import hashlib
import http.client
import http.server
import json
import os
import re
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from xml.sax.saxutils import escape

MiB = 1 << 20
PIECE = 128 << 10  # bytes a body moves in under shaping (and the token buckets' bursts)


@dataclasses.dataclass(frozen=True)
class Shaping:
    ttfb_s: float = 0.0
    conn_bps: float = 0.0  # 0: no cap
    link_bps: float = 0.0  # 0: no cap

    @classmethod
    def of(cls, ttfb_ms=0.0, conn_mibs=0.0, link_mibs=0.0):
        return cls(ttfb_ms / 1000, conn_mibs * MiB, link_mibs * MiB)

    def describe(self):
        if self == NONE:
            return "no shaping"
        cap = lambda bps: f"{bps / MiB:g} MiB/s" if bps else "uncapped"  # noqa: E731
        return f"TTFB {self.ttfb_s * 1000:g} ms, {cap(self.conn_bps)} a connection, link {cap(self.link_bps)}"


NONE = Shaping()
S3_LIKE = Shaping.of(30, 25, 320)


class TokenBucket:
    """`rate` bytes/s shared by every caller of take(), which sleeps until its bytes are paid
    for; up to `burst` bytes go at once after an idle spell. A virtual clock: free_at is when the
    bytes taken so far have been paid for."""

    def __init__(self, rate, burst=PIECE):
        self.rate, self.burst_s = rate, burst / rate
        self.free_at = 0.0
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            self.free_at = max(self.free_at, now - self.burst_s) + n / self.rate
            wait = self.free_at - now
        if wait > 0:
            time.sleep(wait)


class S3Error(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code = status, code


class Obj:
    """An object's bytes: a local file (path) or in-memory pieces (an upload's parts, not joined)."""

    def __init__(self, pieces=None, path=None, etag=None):
        self.path = path
        self.pieces = [p for p in pieces or [] if p]
        self.starts, at = [], 0
        for p in self.pieces:
            self.starts.append(at)
            at += len(p)
        self.size = os.path.getsize(path) if path else at
        self.etag = etag or '"%s"' % uuid.uuid4().hex
        self.mtime = time.time()

    def reader(self):
        """A function (offset, n) -> bytes-like of up to n bytes; close it with .close if it has one."""
        if self.path:
            fd = os.open(self.path, os.O_RDONLY)
            read = lambda at, n: os.pread(fd, n, at)  # noqa: E731
            read.close = lambda: os.close(fd)
            return read

        def read(at, n):
            i = bisect.bisect_right(self.starts, at) - 1
            off = at - self.starts[i]
            return memoryview(self.pieces[i])[off:off + n]
        return read


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.inflight_now = getattr(self, "inflight_now", 0)
            self.peak = self.inflight_now
            self.ops, self.connections, self.bytes_out, self.bytes_in = {}, 0, 0, 0

    def begin(self, op, new_connection):
        with self.lock:
            self.inflight_now += 1
            self.peak = max(self.peak, self.inflight_now)
            self.ops[op or "other"] = self.ops.get(op or "other", 0) + 1
            self.connections += new_connection

    def end(self):
        with self.lock:
            self.inflight_now -= 1

    def add(self, name, n):
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self):
        with self.lock:
            return {"in_flight": self.inflight_now, "peak_in_flight": self.peak, "requests": dict(self.ops),
                    "connections": self.connections, "bytes_out": self.bytes_out, "bytes_in": self.bytes_in}


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def xml_doc(root, body):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"{body}</{root}>").encode()


def parse_range(header, size):
    """(lo, hi) inclusive of `Range: bytes=...` or None (no range, or one S3 would ignore: several
    ranges, unparsable); raises 416 for a range that starts past the end."""
    m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header or "")
    if not m or m.group(1) == m.group(2) == "":
        return None
    if m.group(1) == "":
        n = int(m.group(2))
        if n == 0:
            raise S3Error(416, "InvalidRange", "The requested range is not satisfiable")
        return max(0, size - n), size - 1
    lo = int(m.group(1))
    hi = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    if lo >= size or hi < lo:
        raise S3Error(416, "InvalidRange", "The requested range is not satisfiable")
    return lo, hi


class S3Requests:
    """Plain requests to an S3 server at 127.0.0.1:self.port (unsigned: for servers that check no
    signatures, or buckets open to all), and the admin requests of a shaping server."""

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def make_bucket(self, bucket):
        # Public read-write on moto: these requests are unsigned (zckpt's are signed).
        status, _, body = self.request("PUT", "/" + bucket, headers={"x-amz-acl": "public-read-write"})
        assert status == 200, body

    def put(self, bucket, key, data):
        status, headers, body = self.request("PUT", f"/{bucket}/{urllib.parse.quote(key)}", body=data,
                                             headers={"Content-Type": "application/octet-stream"})
        assert status == 200, body
        return headers.get("ETag")

    def get(self, bucket, key):
        status, _, body = self.request("GET", f"/{bucket}/{urllib.parse.quote(key)}")
        return status, body

    def keys(self, bucket):
        status, _, body = self.request("GET", f"/{bucket}?list-type=2")
        assert status == 200, body
        text = body.decode()
        return [part.split("</Key>")[0] for part in text.split("<Key>")[1:]]

    def uploads(self, bucket):
        status, _, body = self.request("GET", f"/{bucket}?uploads")
        assert status == 200, body
        return body.decode().count("<UploadId>")

    # The shaping server's own (admin) requests.

    def _admin(self, method, what, obj=None):
        status, _, body = self.request(method, "/_shaping/" + what, body=None if obj is None else json.dumps(obj))
        if status != 200:
            raise RuntimeError(f"{what}: HTTP {status}: {body[-500:]!r}")
        return json.loads(body)

    def stats(self):
        return self._admin("GET", "stats")

    def reset_stats(self):
        self._admin("POST", "reset")

    def set_shaping(self, shaping):
        self._admin("PUT", "shaping", dataclasses.asdict(shaping))

    def serve_file(self, bucket, key, path):
        """Serves the local file at `path` as bucket/key (in place: no copy)."""
        return self._admin("PUT", "file", {"bucket": bucket, "key": key, "path": os.path.abspath(path)})["etag"]

    def digest(self, bucket, key):
        return self._admin("GET", "digest?" + urllib.parse.urlencode({"bucket": bucket, "key": key}))

    # A server with a close() is a context manager.

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ShapingServer(S3Requests):
    """The server, in this process: threads of its own (daemons), stopped by close()."""

    def __init__(self, shaping=NONE, port=0, min_part_bytes=5 * MiB, max_body_bytes=8 << 30, idle_timeout_s=120):
        self.lock = threading.Lock()
        self.buckets = {}  # name -> {key: Obj}
        self.multipart = {}  # upload id -> (bucket, key, initiated, {part number: (etag, bytes)})
        self.counters = Counters()
        self.min_part_bytes, self.max_body_bytes = min_part_bytes, max_body_bytes
        self.before = None  # a test's hook: before(method, bucket, key, headers), run before each S3 answer
        self.set_shaping_here(shaping)
        server = self

        class Handler(S3Handler):
            timeout = idle_timeout_s
            srv = server

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            block_on_close = False
            # socketserver's default backlog of 5: a client opening many connections at once had
            # the SYNs past it dropped, and retransmitted a second later.
            request_queue_size = 256

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def set_shaping_here(self, shaping):
        with self.lock:
            self.shaping = shaping
            self.link = TokenBucket(shaping.link_bps, 4 * PIECE) if shaping.link_bps else None
            self.generation = getattr(self, "generation", 0) + 1

    def bucket(self, name):
        got = self.buckets.get(name)
        if got is None:
            raise S3Error(404, "NoSuchBucket", f"The specified bucket does not exist: {name}")
        return got

    def store(self, bucket, key, obj):
        with self.lock:
            self.bucket(bucket)[key] = obj
        return obj

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class S3Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in separate writes: with Nagle's algorithm on, each
    # response's body waited for the client's delayed ACK of its headers (~40 ms a request).
    disable_nagle_algorithm = True
    srv = None  # the ShapingServer (set by a subclass)

    def log_message(self, *a):
        pass

    def setup(self):
        super().setup()
        self.pacer_generation, self.pacer, self.counted = 0, None, False

    # ------------------------------------------------------------ shaping

    def pace(self, n):
        srv = self.srv
        if self.pacer_generation != srv.generation:
            self.pacer_generation = srv.generation
            self.pacer = TokenBucket(srv.shaping.conn_bps) if srv.shaping.conn_bps else None
        if self.pacer:
            self.pacer.take(n)
        link = srv.link
        if link:
            link.take(n)

    def piece_bytes(self):
        s = self.srv.shaping
        return PIECE if s.conn_bps or s.link_bps else 8 * MiB

    def read_exactly(self, n):
        out, left = [], n
        while left:
            b = self.rfile.read(min(self.piece_bytes(), left))
            if not b:
                raise ConnectionError("the client closed the connection mid-body")
            self.pace(len(b))
            out.append(b)
            left -= len(b)
        self.srv.counters.add("bytes_in", n)
        return b"".join(out)

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(4096) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                if sum(map(len, parts)) + size > self.srv.max_body_bytes:
                    raise S3Error(400, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed size")
                parts.append(self.read_exactly(size))
                self.rfile.readline(16)
            body = b"".join(parts)
        else:
            n = int(self.headers.get("Content-Length") or 0)
            if n > self.srv.max_body_bytes:
                self.close_connection = True
                raise S3Error(400, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed size")
            body = self.read_exactly(n)
        if "aws-chunked" in self.headers.get("Content-Encoding", ""):
            body = decode_aws_chunked(body)
        return body

    # ------------------------------------------------------------ answers

    def reply(self, status, headers=(), body=b"", length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def reply_xml(self, root, body, status=200):
        self.reply(status, [("Content-Type", "application/xml")], xml_doc(root, body))

    def reply_error(self, e):
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{e.code}</Code><Message>{escape(str(e))}'
                f"</Message><Resource>{escape(urllib.parse.urlsplit(self.path).path)}</Resource></Error>").encode()
        self.reply(e.status, [("Content-Type", "application/xml")], b"" if self.command == "HEAD" else body)

    def send_paced(self, read, lo, n):
        at, end = lo, lo + n
        while at < end:
            b = read(at, min(self.piece_bytes(), end - at))
            self.pace(len(b))
            self.srv.counters.add("bytes_out", len(b))
            self.wfile.write(b)
            at += len(b)

    # ------------------------------------------------------------ routing

    def handle_request(self):
        url = urllib.parse.urlsplit(self.path)  # AWS's CRT sends the absolute form
        path = urllib.parse.unquote(url.path)
        q = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        q = {k: v[0] for k, v in q.items()}
        if path.startswith("/_shaping/"):
            return self.admin(path[len("/_shaping/"):], q)
        srv = self.srv
        bucket, _, key = path.lstrip("/").partition("/")
        op = operation(self.command, bucket, key, q)
        # Counted as it begins: a client that has its answer sees it in the counters.
        srv.counters.begin(op, new_connection=not self.counted)
        self.counted = True
        try:
            if srv.shaping.ttfb_s:
                time.sleep(srv.shaping.ttfb_s)
            if srv.before:
                srv.before(self.command, bucket, key, self.headers)
            body = self.read_body() if self.command in ("PUT", "POST") else b""
            if op is None or "x-amz-copy-source" in self.headers:
                raise S3Error(501, "NotImplemented", f"{self.command} {url.path}?{url.query} is not implemented here")
            getattr(self, op)(bucket, key, q, body)
        except S3Error as e:
            self.reply_error(e)
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True
        finally:
            srv.counters.end()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_request

    # One method an operation, named as S3 names it (the counters' names).

    def CreateBucket(self, bucket, key, q, body):
        with self.srv.lock:
            self.srv.buckets.setdefault(bucket, {})
        self.reply(200, [("Location", "/" + bucket)])

    def HeadBucket(self, bucket, key, q, body):
        self.srv.bucket(bucket)
        self.reply(200)

    def PutObject(self, bucket, key, q, body):
        obj = self.srv.store(bucket, key, Obj([body]))
        self.reply(200, [("ETag", obj.etag)])

    def CreateMultipartUpload(self, bucket, key, q, body):
        self.srv.bucket(bucket)
        uid = uuid.uuid4().hex
        with self.srv.lock:
            self.srv.multipart[uid] = (bucket, key, time.time(), {})
        self.reply_xml("InitiateMultipartUploadResult", f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                                                        f"<UploadId>{uid}</UploadId>")

    def AbortMultipartUpload(self, bucket, key, q, body):
        with self.srv.lock:
            self.upload(bucket, key, q["uploadId"])
            del self.srv.multipart[q["uploadId"]]
        self.reply(204)

    def DeleteObject(self, bucket, key, q, body):
        with self.srv.lock:
            self.srv.bucket(bucket).pop(key, None)
        self.reply(204)

    def GetObject(self, bucket, key, q, body):
        with self.srv.lock:
            obj = self.srv.bucket(bucket).get(key)
        if obj is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
        match = self.headers.get("If-Match")
        if match and match.strip() != "*" and obj.etag not in [t.strip() for t in match.split(",")]:
            raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
        none_match = self.headers.get("If-None-Match")
        if none_match and (none_match.strip() == "*" or obj.etag in [t.strip() for t in none_match.split(",")]):
            self.reply(304, [("ETag", obj.etag)])
            return
        try:
            rng = parse_range(self.headers.get("Range"), obj.size)
        except S3Error:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{obj.size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        lo, hi = rng or (0, obj.size - 1)
        n = hi - lo + 1
        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        if rng:
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{obj.size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", obj.etag)
        self.send_header("Last-Modified", email.utils.formatdate(obj.mtime, usegmt=True))
        self.end_headers()
        if self.command == "HEAD" or n <= 0:
            return
        read = obj.reader()
        try:
            self.send_paced(read, lo, n)
        finally:
            getattr(read, "close", lambda: None)()

    def ListObjectsV2(self, bucket, key, q, body):
        with self.srv.lock:
            keys = sorted(self.srv.bucket(bucket).items())
        prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
        after = q.get("start-after", "")
        token = q.get("continuation-token")
        if token:
            try:
                after = max(after, base64.urlsafe_b64decode(token.encode()).decode())
            except ValueError:
                raise S3Error(400, "InvalidArgument", "The continuation token provided is incorrect") from None
        limit = max(0, min(int(q.get("max-keys") or 1000), 1000))
        contents, prefixes, last, truncated = [], [], None, False
        for key, obj in keys:
            if not key.startswith(prefix) or key <= after:
                continue
            cut = key.find(delim, len(prefix)) if delim else -1
            common = key[:cut + len(delim)] if cut >= 0 else None
            if common and prefixes and prefixes[-1] == common:
                last = key
                continue
            if len(contents) + len(prefixes) >= limit:
                truncated = True
                break
            if common:
                prefixes.append(common)
            else:
                contents.append(f"<Contents><Key>{escape(key)}</Key><LastModified>{iso(obj.mtime)}</LastModified>"
                                f"<ETag>{escape(obj.etag)}</ETag><Size>{obj.size}</Size>"
                                "<StorageClass>STANDARD</StorageClass></Contents>")
            last = key
        body = (f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents) + len(prefixes)}"
                f"</KeyCount><MaxKeys>{limit}</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
        if delim:
            body += f"<Delimiter>{escape(delim)}</Delimiter>"
        if token:
            body += f"<ContinuationToken>{escape(token)}</ContinuationToken>"
        if truncated:
            body += f"<NextContinuationToken>{base64.urlsafe_b64encode(last.encode()).decode()}</NextContinuationToken>"
        body += "".join(contents) + "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
                                            for p in prefixes)
        self.reply_xml("ListBucketResult", body)

    def ListMultipartUploads(self, bucket, key, q, body):
        prefix = q.get("prefix", "")
        with self.srv.lock:
            self.srv.bucket(bucket)
            ups = sorted((k, t, uid) for uid, (b, k, t, _) in self.srv.multipart.items() if b == bucket and k.startswith(prefix))
        body = f"<Bucket>{escape(bucket)}</Bucket><Prefix>{escape(prefix)}</Prefix><IsTruncated>false</IsTruncated>"
        body += "".join(f"<Upload><Key>{escape(k)}</Key><UploadId>{uid}</UploadId><Initiated>{iso(t)}</Initiated>"
                        "<StorageClass>STANDARD</StorageClass></Upload>" for k, t, uid in ups)
        self.reply_xml("ListMultipartUploadsResult", body)

    def upload(self, bucket, key, uid):
        """The upload `uid` of bucket/key (the caller holds srv.lock)."""
        got = self.srv.multipart.get(uid)
        if got is None or got[:2] != (bucket, key):
            raise S3Error(404, "NoSuchUpload", "The specified multipart upload does not exist.")
        return got

    def UploadPart(self, bucket, key, q, body):
        try:
            number = int(q["partNumber"])
        except ValueError:
            number = 0
        if not 1 <= number <= 10000:
            raise S3Error(400, "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive")
        etag = '"%s"' % uuid.uuid4().hex
        with self.srv.lock:
            self.upload(bucket, key, q.get("uploadId", ""))[3][number] = (etag, body)
        self.reply(200, [("ETag", etag)])

    def CompleteMultipartUpload(self, bucket, key, q, body):
        uid = q["uploadId"]
        listed = [(int(re.search(r"<PartNumber>\s*(\d+)\s*</PartNumber>", p).group(1)),
                   re.search(r"<ETag>(.*?)</ETag>", p, re.S).group(1).strip().replace("&quot;", '"'))
                  for p in re.findall(r"<Part>(.*?)</Part>", body.decode("utf-8", "replace"), re.S)]
        with self.srv.lock:
            parts = self.upload(bucket, key, uid)[3]
            if not listed:
                raise S3Error(400, "MalformedXML", "The XML you provided was not well-formed")
            numbers = [n for n, _ in listed]
            if numbers != sorted(set(numbers)):
                raise S3Error(400, "InvalidPartOrder", "The list of parts was not in ascending order.")
            for n, etag in listed:
                if n not in parts or parts[n][0].strip('"') != etag.strip('"'):
                    raise S3Error(400, "InvalidPart", f"Part {n} was not uploaded or its ETag differs.")
            pieces = [parts[n][1] for n in numbers]
            if any(len(p) < self.srv.min_part_bytes for p in pieces[:-1]):
                raise S3Error(400, "EntityTooSmall", "Your proposed upload is smaller than the minimum allowed size")
            del self.srv.multipart[uid]
            obj = Obj(pieces, etag='"%s-%d"' % (uuid.uuid4().hex, len(pieces)))
            self.srv.bucket(bucket)[key] = obj
        self.reply_xml("CompleteMultipartUploadResult", f"<Location>{self.srv.url}/{escape(bucket)}/{escape(key)}</Location>"
                                                         f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                                                         f"<ETag>{escape(obj.etag)}</ETag>")

    HeadObject = GetObject

    def admin(self, what, q):
        srv = self.srv
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"null") if n else None
        try:
            if what == "stats":
                out = srv.counters.snapshot()
                out["shaping"] = dataclasses.asdict(srv.shaping)
            elif what == "reset":
                srv.counters.reset()
                out = {}
            elif what == "shaping":
                srv.set_shaping_here(Shaping(**body))
                out = dataclasses.asdict(srv.shaping)
            elif what == "file":
                with srv.lock:
                    srv.buckets.setdefault(body["bucket"], {})
                out = {"etag": srv.store(body["bucket"], body["key"], Obj(path=body["path"])).etag}
            elif what == "digest":
                with srv.lock:
                    obj = srv.bucket(q["bucket"]).get(q["key"])
                if obj is None:
                    raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
                h, read = hashlib.sha256(), obj.reader()
                for at in range(0, obj.size, 8 * MiB):
                    h.update(read(at, min(8 * MiB, obj.size - at)))
                getattr(read, "close", lambda: None)()
                out = {"size": obj.size, "sha256": h.hexdigest(), "etag": obj.etag}
            else:
                raise S3Error(404, "NoSuchAdmin", what)
        except S3Error as e:
            return self.reply_error(e)
        self.reply(200, [("Content-Type", "application/json")], json.dumps(out).encode())


def operation(method, bucket, key, q):
    """The S3 operation a request asks for (the name of its S3Handler method), or None."""
    if not bucket:
        return None
    if not key:
        return {"PUT": "CreateBucket", "HEAD": "HeadBucket",
                "GET": "ListMultipartUploads" if "uploads" in q else "ListObjectsV2"}.get(method)
    if method in ("GET", "HEAD"):
        return "GetObject" if method == "GET" else "HeadObject"
    if method == "PUT":
        return "UploadPart" if "partNumber" in q else "PutObject"
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in q else "CompleteMultipartUpload" if "uploadId" in q else None
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in q else "DeleteObject"
    return None


def decode_aws_chunked(body):
    """The payload of an aws-chunked body (hex size[;chunk-signature=...] CRLF data CRLF ... 0 CRLF
    trailers): boto3's uploads with checksums."""
    out, at = [], 0
    while True:
        eol = body.index(b"\r\n", at)
        size = int(body[at:eol].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[eol + 2:eol + 2 + size])
        at = eol + 2 + size + 2


class ServerProcess(S3Requests):
    """The same server as a process of its own (for a benchmark: its threads then share no
    interpreter lock with the client's), stopped by close() or when this process ends."""

    def __init__(self, shaping=NONE, max_seconds=6 * 3600):
        args = [sys.executable, os.path.abspath(__file__), "--max-seconds", str(max_seconds),
                "--ttfb-ms", str(shaping.ttfb_s * 1000), "--conn-mibs", str(shaping.conn_bps / MiB),
                "--link-mibs", str(shaping.link_bps / MiB)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("http://127.0.0.1:"):
            self.close()
            raise RuntimeError(f"the shaping server did not start (it said {line!r})")
        self.url = line
        self.port = int(line.rsplit(":", 1)[1])

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()  # its watchdog sees the end of its stdin and stops it
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttfb-ms", type=float, default=0)
    ap.add_argument("--conn-mibs", type=float, default=0, help="MiB/s a connection (0: uncapped)")
    ap.add_argument("--link-mibs", type=float, default=0, help="MiB/s all connections together (0: uncapped)")
    ap.add_argument("--max-seconds", type=float, default=3600, help="stops after this long in any case")
    ap.add_argument("--bucket", action="append", default=[], help="a bucket to make (repeatable)")
    args = ap.parse_args()
    server = ShapingServer(Shaping.of(args.ttfb_ms, args.conn_mibs, args.link_mibs), port=args.port)
    for b in args.bucket:
        server.buckets.setdefault(b, {})
    print(server.url, flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), stop.set()), daemon=True).start()
    stop.wait(args.max_seconds)
    server.close()


if __name__ == "__main__":
    main()
