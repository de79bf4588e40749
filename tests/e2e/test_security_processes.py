"""Keys and transport security across real processes: two `memstream serve` processes on one
data directory both refuse a key once a wait on its revocation returned; `serve` refuses to
start without a key and refuses --insecure-no-auth off loopback; HTTPS with a self-signed
certificate; POST /v1/wait on a server that runs no projection, beside `memstream process`."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import turn
from tests.integration.servers import cli_key, embedded_env, free_ports, memstream_serve

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).with_name("memstream")
STARTUP = 240.0


def bearer(key: dict) -> dict:
    return {"Authorization": f"Bearer {key['key']}"}


def cli(data_dir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], env=env or embedded_env(data_dir), capture_output=True, text=True, timeout=300)


def test_two_serve_processes_both_refuse_a_key_after_a_wait_on_its_revocation(tmp_path):
    data = tmp_path / "data"
    with memstream_serve(tmp_path, STARTUP, data_dir=data, name="a") as a, \
            memstream_serve(tmp_path, STARTUP, "--no-process", data_dir=data, name="b") as b:
        reader = cli_key(data, "reader", "t1")
        for served in (a, b):  # a key made by the CLI works at once in both
            assert httpx.get(f"{served.url}/v1/status", headers=bearer(reader), timeout=30).status_code == 200
        listed = cli(data, "keys", "list", "--json")
        assert listed.returncode == 0 and reader["key_id"] in listed.stdout and reader["key"] not in listed.stdout
        revoked = cli(data, "keys", "revoke", reader["key_id"], "--json")
        assert revoked.returncode == 0, revoked.stderr
        offset = __import__("json").loads(revoked.stdout)["control_offset"]
        w = httpx.post(f"{a.url}/v1/wait", json={"control_offset": offset, "timeout_seconds": 30}, headers=a.headers, timeout=60)
        assert w.status_code == 200, w.text
        for served in (a, b):  # b was never told: the wait on a covers it
            r = httpx.get(f"{served.url}/v1/status", headers=bearer(reader), timeout=30)
            assert r.status_code == 401, (served.url, r.text)
        # rotation through the CLI: the new secret works in both, the old one for the grace period only
        writer = cli_key(data, "writer", "t1")
        rotated = cli(data, "keys", "rotate", writer["key_id"], "--grace-hours", "0", "--json")
        new = __import__("json").loads(rotated.stdout)
        httpx.post(f"{b.url}/v1/wait", json={"control_offset": new["control_offset"]}, headers=b.headers, timeout=60)
        for served in (a, b):
            assert httpx.get(f"{served.url}/v1/status", headers=bearer(new), timeout=30).status_code == 200
            assert httpx.get(f"{served.url}/v1/status", headers=bearer(writer), timeout=30).status_code == 401
    for served in (a, b):  # a secret never reaches a log
        log = served.log_path.read_text(errors="replace")
        assert reader["key"] not in log and new["key"] not in log and writer["key"] not in log


def test_serve_refuses_without_a_key_and_insecure_mode_off_loopback(tmp_path):
    data = tmp_path / "data"
    [port] = free_ports(1)
    out = cli(data, "serve", "--port", str(port))
    assert out.returncode == 2 and "memstream keys create" in out.stderr
    out = cli(data, "serve", "--port", str(port), "--host", "0.0.0.0", "--insecure-no-auth")
    assert out.returncode == 2 and "loopback" in out.stderr
    with memstream_serve(tmp_path, STARTUP, "--insecure-no-auth", data_dir=data, admin_key=False) as served:
        assert httpx.get(f"{served.url}/v1/status", timeout=30).json()["auth"]["mode"] == "insecure-no-auth"
    log = served.log_path.read_text(errors="replace")
    assert "AUTHENTICATION IS OFF" in log or "authentication is off" in log


def self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def test_https_with_a_self_signed_certificate(tmp_path):
    cert, key = self_signed(tmp_path)
    with memstream_serve(tmp_path, STARTUP, "--tls-cert", str(cert), "--tls-key", str(key), scheme="https") as served:
        with httpx.Client(verify=str(cert), timeout=30) as client:
            assert client.get(f"{served.url}/v1/status", headers=served.headers).status_code == 200
            signed = client.post(f"{served.url}/dashboard/session", json={"token": served.ops_token})
            assert signed.status_code == 200 and "Secure" in signed.headers["set-cookie"]
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused by a verifying client
            httpx.get(f"{served.url}/healthz", timeout=30)
        with pytest.raises(httpx.HTTPError):  # and plain HTTP is not served on the port
            httpx.get(served.url.replace("https://", "http://") + "/healthz", timeout=30)


def test_wait_on_a_server_that_runs_no_projection_beside_memstream_process(tmp_path):
    data = tmp_path / "data"
    with memstream_serve(tmp_path, STARTUP, "--no-process", data_dir=data) as served:
        worker = subprocess.Popen([str(BIN), "process"], env=embedded_env(data), stdout=open(tmp_path / "process.log", "w"),
                                  stderr=subprocess.STDOUT)
        try:
            events = [__import__("json").loads(turn(i, conv="waiting", text=f"turn {i} about the harbour ferry").model_dump_json())
                      for i in range(5)]
            r = httpx.post(f"{served.url}/v1/events", json=events, headers=served.headers, timeout=60)
            assert r.status_code == 200, r.text
            w = httpx.post(f"{served.url}/v1/wait", json={"positions": r.json()["positions"], "timeout_seconds": 240},
                           headers=served.headers, timeout=300)
            assert w.status_code == 200, (w.text, (tmp_path / "process.log").read_text()[-3000:])
            s = httpx.post(f"{served.url}/v1/search", json={"question": "harbour ferry", "tenant_id": "t1", "conversation_id": "waiting"},
                           headers=served.headers, timeout=60)
            assert s.status_code == 200 and len({t["event_id"] for e in s.json()["evidence"] for t in e["turns"]}) == 5
        finally:
            worker.terminate()
            worker.wait(60)
