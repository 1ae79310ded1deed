"""TLS on the device server (`tls_cert`/`tls_key`) and the client (`root_cert`): a self-signed certificate made here
for 127.0.0.1; a client that does not trust it, or speaks plain text, is refused, and one that does runs a model."""

from __future__ import annotations

import datetime
import ipaddress

import numpy as np
import pytest

grpc = pytest.importorskip("grpc", reason="the device server needs grpcio (pip install ember[rpc])")
x509 = pytest.importorskip("cryptography.x509", reason="making a test certificate needs cryptography")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from rpc_helpers import TOKEN, export_mlp, needs_cc  # noqa: E402

from ember.rpc import RemoteError, connect  # noqa: E402
from ember.rpc.server import serve  # noqa: E402


def self_signed(directory, name: str = "ember-test") -> tuple:
    """(certificate path, key path) of a fresh self-signed certificate for 127.0.0.1 and localhost."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    s = serve("127.0.0.1", 0, key="host", token=TOKEN, tls_cert=cert, tls_key=key)
    yield s, cert
    s.stop()


@needs_cc
def test_a_client_trusting_the_certificate_runs_a_model_over_tls(tls_server, tmp_path):
    server, cert = tls_server
    _, m, export = export_mlp(tmp_path / "mlp")
    x = m.random_inputs(seed=7)[0]
    with connect(f"127.0.0.1:{server.port}", key="host", token=TOKEN, root_cert=cert, timeout=30) as remote:
        assert remote.info()["tls"] is True
        with remote.load(export) as rm:
            assert np.array_equal(rm(x), m(x))
    with pytest.raises(RemoteError) as e:  # TLS does not replace the token
        connect(f"127.0.0.1:{server.port}", token="wrong", root_cert=cert, timeout=30)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_plain_text_and_untrusted_clients_are_refused(tls_server, tmp_path):
    server, cert = tls_server
    address = f"127.0.0.1:{server.port}"
    with pytest.raises(RemoteError) as e:
        connect(address, token=TOKEN, timeout=5)  # no TLS
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    other, _ = self_signed(tmp_path, "someone-else")
    with pytest.raises(RemoteError) as e:
        connect(address, token=TOKEN, root_cert=other, timeout=5)  # a certificate it was not given
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    with connect(address, token=TOKEN, root_cert=cert.read_bytes(), timeout=30) as remote:  # still serving
        assert remote.info()["key"] == "host"


def test_tls_settings_are_checked(tmp_path):
    cert, key = self_signed(tmp_path)
    with pytest.raises(ValueError, match="both a certificate and its private key"):
        serve("127.0.0.1", 0, token=TOKEN, tls_cert=cert)
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="not a PEM file"):
        serve("127.0.0.1", 0, token=TOKEN, tls_cert=tmp_path / "junk.pem", tls_key=key)
    with pytest.raises(ValueError, match="not a PEM certificate"):
        connect("127.0.0.1:1", token=TOKEN, root_cert=tmp_path / "junk.pem")


@needs_cc
def test_ember_rpc_server_with_tls_and_ember_run_with_a_root_certificate(tmp_path, capsys):
    from rpc_helpers import start_server, stop_server

    from ember.cli import main

    cert, key = self_signed(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    _, m, export = export_mlp(tmp_path / "mlp")
    proc, address = start_server(token_file, "host", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        args = ["run", "--rpc", address, "--key", "host", "--token-file", str(token_file), str(export),
                "--output-dir", str(tmp_path / "out")]  # fmt: skip
        assert main([*args, "--root-cert", str(cert)]) == 0
        (name,) = m.output_names
        x = m.random_inputs(0)[0]  # ember run's random inputs for seed 0
        assert np.array_equal(np.load(tmp_path / "out" / f"{name}.npy"), m(x))
        capsys.readouterr()
        assert main(args) == 1  # plain text to a TLS server
        assert "UNAVAILABLE" in capsys.readouterr().err
    finally:
        stop_server(proc)
