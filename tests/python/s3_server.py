"""A real S3 server on localhost for the object-storage tests (moto[server], in a virtualenv of
its own that tools/s3/moto-venv.sh makes on first use), and a small HTTP proxy in front of it
that injects faults between zckpt and the server. Nothing here reaches the network."""
import http.client
import http.server
import os
import socket
import socketserver
import struct
import subprocess
import threading
import time
import urllib.request

import zckpt_testing

MOTO_VENV_SCRIPT = os.path.join(zckpt_testing.REPO, "tools", "s3", "moto-venv.sh")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_python():
    """The python of the moto venv, made if missing; (None, why) when it cannot be."""
    try:
        r = subprocess.run(["bash", MOTO_VENV_SCRIPT], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"tools/s3/moto-venv.sh did not finish: {e}"
    if r.returncode != 0:
        return None, "tools/s3/moto-venv.sh failed (no moto[server]): " + r.stderr.strip()[-500:]
    return r.stdout.strip().splitlines()[-1], None


class MotoServer:
    """moto_server on 127.0.0.1:PORT, stopped by close()."""

    def __init__(self, python):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, MOTO_ALLOW_NONEXISTENT_REGION="true")
        self.proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/", timeout=2).read()
                return
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.close()
                    raise RuntimeError("moto_server did not start on " + self.url)
                time.sleep(0.2)

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, dict(r.getheaders()), data

    def make_bucket(self, bucket):
        # Public read-write: this helper's own requests are unsigned (zckpt's are signed).
        status, _, body = self.request("PUT", "/" + bucket, headers={"x-amz-acl": "public-read-write"})
        assert status == 200, body

    def put(self, bucket, key, data):
        status, headers, body = self.request("PUT", f"/{bucket}/{key}", body=data,
                                             headers={"Content-Type": "application/octet-stream"})
        assert status == 200, body
        return headers.get("ETag")

    def get(self, bucket, key):
        status, _, body = self.request("GET", f"/{bucket}/{key}")
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

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class FaultProxy:
    """HTTP/1.1 proxy on 127.0.0.1 in front of `upstream`. `fault(method, path, headers, n)`,
    where n numbers the ranged GETs (from 1; 0 for every other request), returns None (pass
    through) or one of ("status", CODE) / ("reset",) (half the body, then RST) / ("flip",) or
    ("flip", AT) (a byte of the body, the middle one or body[AT]) / ("stall", SECONDS) /
    ("forbidden",) (403 InvalidAccessKeyId) / ("before", callable) (runs it, then passes through);
    every request is logged in `log` as (method, path, range)."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.fault = lambda method, path, headers, n: None
        self.log = []
        self.lock = threading.Lock()
        self.ranged_gets = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                ranged = self.command == "GET" and "Range" in self.headers
                with proxy.lock:
                    if ranged:
                        proxy.ranged_gets += 1
                    n = proxy.ranged_gets
                    proxy.log.append((self.command, self.path, self.headers.get("Range")))
                action = proxy.fault(self.command, self.path, self.headers, n if ranged else 0)
                if action and action[0] == "before":
                    action[1]()
                    action = None
                if action and action[0] == "status":
                    payload = (f"<?xml version='1.0'?><Error><Code>{'SlowDown' if action[1] == 503 else 'InternalError'}"
                               f"</Code><Message>injected</Message></Error>").encode()
                    self._reply(action[1], {"Content-Type": "application/xml"}, payload)
                    return
                if action and action[0] == "forbidden":
                    payload = (b"<?xml version='1.0'?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key "
                               b"Id you provided does not exist in our records.</Message></Error>")
                    self._reply(403, {"Content-Type": "application/xml"}, b"" if self.command == "HEAD" else payload,
                                length=len(payload))
                    return
                if action and action[0] == "stall":
                    time.sleep(action[1])
                    self.close_connection = True
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                out = {k: v for k, v in r.getheaders() if k.lower() not in ("transfer-encoding", "connection",
                                                                             "content-length")}
                if action and action[0] == "flip" and data:
                    data = bytearray(data)
                    data[action[1] if len(action) > 1 else len(data) // 2] ^= 0x40
                    data = bytes(data)
                if action and action[0] == "reset" and len(data) > 1:
                    self.send_response(r.status)
                    for k, v in out.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                length = len(data) if self.command != "HEAD" else r.getheader("Content-Length")
                self._reply(r.status, out, data if self.command != "HEAD" else b"", length=length)

            def _reply(self, status, headers, data, length=None):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()
                if data:
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self, fault=None):
        with self.lock:
            self.fault = fault or (lambda method, path, headers, n: None)
            self.log = []
            self.ranged_gets = 0

    def close(self):
        self.server.shutdown()
        self.server.server_close()
