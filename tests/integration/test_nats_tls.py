"""NATS over TLS against a real nats-server: the server runs the embedded operator's configuration with a
``tls`` block requiring client certificates (``verify: true``), on certificates made here with
``cryptography`` (a CA, a server certificate for 127.0.0.1, a client certificate). The service's settings
(``REMEDIATOR_NATS_TLS_CA``/``_CERT``/``_KEY``, ``bus.Credentials``) connect with the CA and the client
certificate; without the CA (the system trust store does not know ours) or without a client certificate
the connection is refused, and the CLI says so in one line naming the settings.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from remediator import bus
from remediator.errors import SetupError
from remediator.identity.store import OperatorStore
from remediator.natsd import find_nats_server, free_port
from remediator.settings import Settings

pytestmark = pytest.mark.timeout(90)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
          issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer.subject if issuer else name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                         x509.DNSName("localhost")]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(root: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("remediator-test-ca", ca_key, None, ca_key, ca=True)
    files: dict[str, Path] = {"ca": root / "ca.crt"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name, server in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(f"remediator-test-{name}", key, ca, ca_key, server=server)
        files[f"{name}_cert"], files[f"{name}_key"] = root / f"{name}.crt", root / f"{name}.key"
        files[f"{name}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(files[f"{name}_key"], key)
    return files


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, dict[str, Path], OperatorStore]]:
    """(tls:// URL, PKI files, operator store) of a nats-server in operator mode requiring client certs."""
    pki = make_pki(tmp_path / "pki")
    store = OperatorStore.open(tmp_path / "identity")
    port = free_port()
    config = tmp_path / "nats.conf"
    config.write_text(store.server_config(now=dt.datetime.now(dt.UTC)) + "\n".join([
        "tls: {",
        f"  cert_file: {json.dumps(str(pki['server_cert']))}",
        f"  key_file: {json.dumps(str(pki['server_key']))}",
        f"  ca_file: {json.dumps(str(pki['ca']))}",
        "  verify: true",
        "  timeout: 2",
        "}",
        ""]))
    proc = subprocess.Popen([find_nats_server(), "-c", str(config), "-a", "127.0.0.1", "-p", str(port), "-js",
                             "-sd", str(tmp_path / "js")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not listen within 15 s"
                time.sleep(0.05)
        yield f"tls://127.0.0.1:{port}", pki, store
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


async def test_the_service_connects_with_the_ca_and_its_client_certificate(
        tls_server: tuple[str, dict[str, Path], OperatorStore]) -> None:
    url, pki, store = tls_server
    creds = str(store.role_creds("admin"))
    full = bus.Credentials(creds_file=creds, tls_ca=str(pki["ca"]), tls_cert=str(pki["client_cert"]),
                           tls_key=str(pki["client_key"]))
    nc, js = await bus.connect_within(url, 10, name="tls-ok", credentials=full, allow_reconnect=False,
                                      max_reconnect_attempts=0)
    try:
        assert nc.is_connected
        await bus.provision(js, Settings())
        assert (await js.stream_info("FAULTS")).config.name == "FAULTS"  # JetStream over TLS works
    finally:
        await nc.close()

    # without the CA the server's certificate is not trusted; without a client certificate the server refuses
    for name, without, why in (
            ("no CA", bus.Credentials(creds_file=creds, tls_cert=str(pki["client_cert"]),
                                      tls_key=str(pki["client_key"])), "CERTIFICATE_VERIFY_FAILED"),
            ("no client certificate", bus.Credentials(creds_file=creds, tls_ca=str(pki["ca"])), "")):
        with pytest.raises(SetupError, match="cannot reach NATS") as refused:
            await bus.connect_within(url, 3, name=name, credentials=without, quiet=True, allow_reconnect=False,
                                     max_reconnect_attempts=0)
        assert why in str(refused.value), (name, str(refused.value))


def test_the_cli_connects_with_the_tls_settings_and_fails_in_one_line_without_them(
        tls_server: tuple[str, dict[str, Path], OperatorStore]) -> None:
    url, pki, store = tls_server
    base = {**os.environ, "REMEDIATOR_NATS_CREDS_FILE": str(store.role_creds("admin")),
            "REMEDIATOR_STARTUP_TIMEOUT_S": "3"}
    tls = {"REMEDIATOR_NATS_TLS_CA": str(pki["ca"]), "REMEDIATOR_NATS_TLS_CERT": str(pki["client_cert"]),
           "REMEDIATOR_NATS_TLS_KEY": str(pki["client_key"])}

    def init(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "remediator.cli", "bus", "init", "--nats", url], env=env,
                              capture_output=True, text=True, timeout=60)

    ok = init({**base, **tls})
    assert ok.returncode == 0, ok.stderr
    refused = init({**base, "REMEDIATOR_NATS_TLS_CERT": tls["REMEDIATOR_NATS_TLS_CERT"],
                    "REMEDIATOR_NATS_TLS_KEY": tls["REMEDIATOR_NATS_TLS_KEY"]})  # no CA
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach NATS" in lines[0] and "Traceback" not in refused.stderr, refused.stderr
