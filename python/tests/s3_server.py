"""A real S3 server for the tests: moto in server mode on 127.0.0.1 with a free port, and a
fault proxy in front of it for what the server cannot do by itself (503 SlowDown, connections
reset mid-request)."""

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, Tuple


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """`unauthenticated`: with a number, the server accepts that many requests unsigned, then
    checks every request's SigV4 signature against the access keys created through its IAM
    API (moto's INITIAL_NO_AUTH_ACTION_COUNT), and the IAM policies of their user."""

    def __init__(self, unauthenticated: Optional[int] = None) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        if unauthenticated is not None:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(unauthenticated)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class FaultProxy:
    """Forwards to `upstream`; of every `every` requests (0: none), one gets 503 SlowDown and
    the next one has its connection closed without a reply (a reset). `gate(method, path)`,
    when given, runs before each request is forwarded: a test may hold requests there.
    `lose_reply(method, path)`, when it says so, forwards the request and closes the
    connection instead of replying (the request took effect; its client does not know).
    `answer(method, path, headers)`, when it returns (status, body), answers that instead of
    forwarding (the request never took effect)."""

    def __init__(self, upstream_port: int, every: int = 4,
                 gate: Optional[Callable[[str, str], None]] = None,
                 lose_reply: Optional[Callable[[str, str], bool]] = None,
                 answer: Optional[Callable[[str, str, Any], Optional[Tuple[int, bytes]]]] = None
                 ) -> None:
        self.count = 0
        self.slowdowns = 0
        self.resets = 0
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with lock:
                    proxy.count += 1
                    n = proxy.count
                if every and n % every == 1:
                    with lock:
                        proxy.slowdowns += 1
                    msg = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                           b"<Message>Please reduce your request rate.</Message></Error>")
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if every and n % every == 2:
                    with lock:
                        proxy.resets += 1
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if gate is not None:
                    gate(self.command, self.path)
                canned = (answer(self.command, self.path, self.headers) if answer is not None
                          else None)
                if canned is not None:
                    self.send_response(canned[0])
                    self.send_header("Content-Length", str(len(canned[1])))
                    self.end_headers()
                    self.wfile.write(canned[1])
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
                headers = {k: v for k, v in self.headers.items()}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if lose_reply is not None and lose_reply(self.command, self.path):
                    conn.close()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # A HEAD reply's length is the object's, not of the (empty) body.
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
