"""A real S3 server on localhost for the object-storage tests (moto[server], in a virtualenv of
its own that tools/s3/moto-venv.sh makes on first use), and a small HTTP proxy in front of it
that injects faults between zckpt and the server. Nothing here reaches the network. The shaping
S3 server (tools/s3/shaping_server.py: latency and throughput caps, for tests and benchmarks) is
importable from here too, as shaping_server."""
import http.client
import http.server
import os
import socket
import socketserver
import struct
import subprocess
import threading
import time
import sys
import urllib.request

import zckpt_testing

sys.path.insert(0, os.path.join(zckpt_testing.REPO, "tools", "s3"))
import shaping_server  # noqa: E402

MOTO_VENV_SCRIPT = os.path.join(zckpt_testing.REPO, "tools", "s3", "moto-venv.sh")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def point_zckpt_at(monkeypatch, url, **settings):
    """Points zckpt (this process, and the processes it starts) at the S3 server at `url`: fixed
    test keys, short retries and timeouts, none of the caller's own AWS settings; `settings`
    override or add variables. Returns what was set."""
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "ZCKPT_S3_BACKOFF": "0.01", "ZCKPT_S3_ATTEMPTS": "4", "ZCKPT_S3_TIMEOUT": "2"}
    env.update(settings)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "ZCKPT_S3_LIST_KEYS"):
        if k not in env:
            monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def serve_moto(bucket, check_signatures=False):
    """A module fixture's body: a MotoServer with `bucket` made, closed afterwards; the test
    is skipped (saying why) where moto cannot be installed. `yield from serve_moto(...)`."""
    import pytest
    python, why = moto_python()
    if python is None:
        pytest.skip(why)
    server = MotoServer(python, check_signatures=check_signatures)
    server.python = python
    try:
        if check_signatures:
            server.make_signed_bucket(python, bucket)
        else:
            server.make_bucket(bucket)
        yield server
    finally:
        server.close()


def moto_python():
    """The python of the moto venv, made if missing; (None, why) when it cannot be."""
    try:
        r = subprocess.run(["bash", MOTO_VENV_SCRIPT], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"tools/s3/moto-venv.sh did not finish: {e}"
    if r.returncode != 0:
        return None, "tools/s3/moto-venv.sh failed (no moto[server]): " + r.stderr.strip()[-500:]
    return r.stdout.strip().splitlines()[-1], None


class MotoServer(shaping_server.S3Requests):
    """moto_server on 127.0.0.1:PORT, stopped by close().

    check_signatures=True: the server checks every request's SigV4 signature and access key as
    S3 does (moto's IAM mode: after INITIAL_NO_AUTH_ACTION_COUNT unchecked actions, each spent
    here on creating an IAM user with an allow-all policy and its access key, which are then
    `access_key`/`secret_key`); a request signed wrong gets 403 SignatureDoesNotMatch. Otherwise
    nothing is checked and the helper's own unsigned requests below work."""

    IAM_SETUP_ACTIONS = 3  # create_user, put_user_policy, create_access_key

    def __init__(self, python, check_signatures=False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_key = self.secret_key = None
        env = dict(os.environ, MOTO_ALLOW_NONEXISTENT_REGION="true")
        if check_signatures:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(self.IAM_SETUP_ACTIONS)
        self.proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 60
        while True:
            try:
                if check_signatures:  # a TCP connect only: an HTTP request would spend an action
                    socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                else:
                    urllib.request.urlopen(self.url + "/", timeout=2).read()
                break
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.close()
                    raise RuntimeError("moto_server did not start on " + self.url)
                time.sleep(0.2)
        if check_signatures:
            self._make_access_key(python)

    def _make_access_key(self, python):
        script = f"""
import json, boto3
iam = boto3.client("iam", endpoint_url={self.url!r}, region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="zckpt")
iam.put_user_policy(UserName="zckpt", PolicyName="all", PolicyDocument=json.dumps(
    {{"Version": "2012-10-17", "Statement": [{{"Effect": "Allow", "Action": "*", "Resource": "*"}}]}}))
key = iam.create_access_key(UserName="zckpt")["AccessKey"]
print(key["AccessKeyId"], key["SecretAccessKey"])
"""
        r = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            self.close()
            raise RuntimeError("could not make an IAM access key on moto: " + r.stderr[-1000:])
        self.access_key, self.secret_key = r.stdout.split()

    def temporary_credentials(self, python):
        """(key, secret, session token) of an assumed IAM role allowed everything (STS
        AssumeRole, signed with the IAM key): requests with them must carry the token."""
        script = f"""
import json, boto3
kw = dict(endpoint_url={self.url!r}, region_name="us-east-1",
          aws_access_key_id={self.access_key!r}, aws_secret_access_key={self.secret_key!r})
iam = boto3.client("iam", **kw)
trust = {{"Version": "2012-10-17", "Statement": [{{"Effect": "Allow", "Principal": {{"AWS": "*"}}, "Action": "sts:AssumeRole"}}]}}
arn = iam.create_role(RoleName="zckpt-role", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
iam.put_role_policy(RoleName="zckpt-role", PolicyName="all", PolicyDocument=json.dumps(
    {{"Version": "2012-10-17", "Statement": [{{"Effect": "Allow", "Action": "*", "Resource": "*"}}]}}))
c = boto3.client("sts", **kw).assume_role(RoleArn=arn, RoleSessionName="zckpt-test")["Credentials"]
print(c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"])
"""
        r = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("could not assume an IAM role on moto: " + r.stderr[-1000:])
        return tuple(r.stdout.split())

    def boto(self, python, code):
        """Runs `code` in the moto venv's python with `s3`, a boto3 client signed with the IAM key
        (a signature-checking server); returns what it printed."""
        script = (f"import json, boto3\ns3 = boto3.client('s3', endpoint_url={self.url!r}, region_name='us-east-1', "
                  f"aws_access_key_id={self.access_key!r}, aws_secret_access_key={self.secret_key!r})\n" + code)
        r = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("boto3 on moto failed: " + r.stderr[-1000:])
        return r.stdout

    def make_signed_bucket(self, python, bucket):
        """A bucket made by boto3 with the IAM key (a signature-checking server)."""
        self.boto(python, f"s3.create_bucket(Bucket={bucket!r})")

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
