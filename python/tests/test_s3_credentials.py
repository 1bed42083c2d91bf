"""The AWS default credential chain against real endpoints: moto's STS for a web identity, a
local container-credentials endpoint and a local instance metadata service (IMDSv2) standing in
for AWS's, each in front of the moto S3 server through a proxy that records which key signed
every S3 request -- and refuses a key once the endpoint's expiry for it has passed, so the
engine must fetch new credentials before they run out."""

import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import WORKERS
from s3_server import FaultProxy, MotoServer
from test_s3 import BUCKET, run

pytest.importorskip("moto")
pytest.importorskip("boto3")

EXPIRED = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ExpiredToken</Code>"
           b"<Message>The provided token has expired.</Message></Error>")
# Every variable of the chain cleared, so that only the source under test is configured.
NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
                  "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    yield server
    server.stop()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class SigningRecorder:
    """A FaultProxy's `answer`: records the access key of every signed request, and answers
    ExpiredToken to a key whose `expires` time has passed."""

    def __init__(self) -> None:
        self.keys = []
        self.tokens = set()
        self.expires = {}
        self.refused = 0

    def __call__(self, method, path, headers):
        auth = headers.get("Authorization") or ""
        if "Credential=" not in auth:
            return None  # STS is called unsigned
        key = auth.split("Credential=")[1].split("/")[0]
        self.keys.append(key)
        self.tokens.add(headers.get("x-amz-security-token"))
        if key in self.expires and time.time() > self.expires[key]:
            self.refused += 1
            return 400, EXPIRED
        return None


class CredentialEndpoint:
    """A local HTTP server: `routes[(method, path)](handler) -> (status, body)`."""

    def __init__(self, routes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                route = routes.get((self.command, self.path))
                status, body = route(self) if route else (404, b"not found")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def roundtrip(proxy, prefix, env, pause=None):
    args = [sys.executable, str(WORKERS / "s3_job.py"), "roundtrip", f"s3://{BUCKET}/{prefix}"]
    p = run(args + ([str(pause)] if pause else []),
            env={**NO_CREDENTIALS, "AWS_ENDPOINT_URL": proxy.endpoint, **env})
    assert p.returncode == 0 and "roundtrip ok" in p.stdout, p.stdout + p.stderr
    return p


def test_web_identity_is_exchanged_at_sts(moto, tmp_path):
    """AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN (a Kubernetes service account's): the token
    goes to STS AssumeRoleWithWebIdentity (moto's), and every S3 request is signed with the
    session credentials it returns."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n")
    recorder = SigningRecorder()
    proxy = FaultProxy(moto.port, every=0, answer=recorder)
    try:
        roundtrip(proxy, "web-identity/ck", {
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
            "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/trainer",
            "AWS_ROLE_SESSION_NAME": "job-7"})
    finally:
        proxy.stop()
    assert recorder.keys and len(set(recorder.keys)) == 1, set(recorder.keys)
    assert recorder.keys[0] not in ("", "test"), recorder.keys[0]
    assert recorder.tokens and None not in recorder.tokens, recorder.tokens


def test_container_credentials_are_refreshed_before_they_expire(moto, tmp_path):
    """ECS / EKS Pod Identity: credentials from AWS_CONTAINER_CREDENTIALS_FULL_URI with the
    token of AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE. They live 6 s here; the job pauses 5 s
    between its save and its load, so its first credentials would be refused by then: it
    fetches new ones before (half their life), and the store never refuses a request."""
    token = tmp_path / "auth"
    token.write_text("Bearer-abc\n")
    recorder = SigningRecorder()
    fetched = []

    def creds(handler):
        if handler.headers.get("Authorization") != "Bearer-abc":
            return 401, b"unauthorized"
        key = f"CONTAINERKEY{len(fetched)}"
        recorder.expires[key] = time.time() + 6
        fetched.append(key)
        return 200, json.dumps({"AccessKeyId": key, "SecretAccessKey": "s", "Token": "t" + key,
                                "Expiration": iso(recorder.expires[key])}).encode()

    endpoint = CredentialEndpoint({("GET", "/v2/credentials/abc"): creds})
    proxy = FaultProxy(moto.port, every=0, answer=recorder)
    try:
        roundtrip(proxy, "container/ck", {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": endpoint.url + "/v2/credentials/abc",
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}, pause=5)
    finally:
        proxy.stop()
        endpoint.stop()
    assert len(fetched) >= 2, fetched
    assert recorder.refused == 0, recorder.refused
    assert set(recorder.keys) <= set(fetched) and len(set(recorder.keys)) >= 2, recorder.keys


def test_instance_metadata_v2(moto):
    """An EC2 instance's role through IMDSv2: a session token by PUT first, then the role's
    credentials with it (the endpoint refuses requests without one, as IMDSv2-only instances
    do)."""
    recorder = SigningRecorder()
    tokens = []

    def session(handler):
        if not handler.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return 400, b"missing ttl"
        tokens.append("imds-session-1")
        return 200, tokens[-1].encode()

    def authorised(body):
        def route(handler):
            if handler.headers.get("X-aws-ec2-metadata-token") not in tokens:
                return 401, b""
            return 200, body() if callable(body) else body
        return route

    role_path = "/latest/meta-data/iam/security-credentials/"
    endpoint = CredentialEndpoint({
        ("PUT", "/latest/api/token"): session,
        ("GET", role_path): authorised(b"trainer-role\n"),
        ("GET", role_path + "trainer-role"): authorised(lambda: json.dumps({
            "Code": "Success", "AccessKeyId": "INSTANCEKEY", "SecretAccessKey": "s",
            "Token": "t", "Expiration": iso(time.time() + 6 * 3600)}).encode()),
    })
    proxy = FaultProxy(moto.port, every=0, answer=recorder)
    try:
        roundtrip(proxy, "imds/ck", {"AWS_EC2_METADATA_DISABLED": "",
                                     "AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint.url})
    finally:
        proxy.stop()
        endpoint.stop()
    assert tokens and set(recorder.keys) == {"INSTANCEKEY"}, (tokens, set(recorder.keys))
