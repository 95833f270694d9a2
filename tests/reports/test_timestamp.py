"""With FXPILOT_TSA_URL set, the signature carries a time-stamp from that authority (a real HTTP TSA here)."""
from __future__ import annotations

import datetime as dt
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from asn1crypto import keys, tsp
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pyhanko.sign.timestamps.dummy_client import DummyTimeStamper

from reports import render, sign
from reports.verify import verify_pdf
from tests.reports.verdicts import gate_context, table1_verdict


def _tsa_identity(ca) -> DummyTimeStamper:
    root_key = serialization.load_pem_private_key((ca / "root-key.pem").read_bytes(), None)
    root = sign.load_cert(ca / "root-cert.pem")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test time-stamp authority")]))
            .issuer_name(root.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
            .sign(root_key, hashes.SHA256()))
    der_key = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return DummyTimeStamper(tsa_cert=asn1_x509.Certificate.load(cert.public_bytes(serialization.Encoding.DER)),
                            tsa_key=keys.PrivateKeyInfo.load(der_key))


@pytest.fixture
def tsa_url(ca):
    stamper = _tsa_identity(ca)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 — the http.server interface
            request = tsp.TimeStampReq.load(self.rfile.read(int(self.headers["Content-Length"])))
            body = stamper.request_tsa_response(request).dump()
            self.send_response(200)
            self.send_header("Content-Type", "application/timestamp-reply")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/tsa"
    server.shutdown()
    server.server_close()


def test_a_tsa_url_time_stamps_the_signature_and_the_report_names_the_authority(tsa_url, vendor_signer, ca, tmp_path):
    context = gate_context(table1_verdict())
    context["signing"]["tsa_url"] = tsa_url
    pdf = render.render_pdf(context, "en")
    data = sign.sign_pdf(pdf, vendor_signer, field_name=sign.VENDOR_FIELD, reason="test", certify=True, tsa_url=tsa_url)
    result = verify_pdf(data, [ca / "root-cert.pem"])
    assert result.ok, result.reasons
    assert result.signatures[0].timestamped
    path = tmp_path / "stamped.pdf"
    path.write_bytes(data)
    text = " ".join(subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True).stdout.split())
    assert f"certified by the time-stamp authority {tsa_url}" in text and "No time-stamp authority" not in text


def test_an_unreachable_tsa_fails_signing_loudly(vendor_signer):
    pdf = render.render_pdf(gate_context(table1_verdict()), "en")
    with pytest.raises(sign.SigningError, match="the time-stamp authority http://127.0.0.1:9/tsa did not answer"):
        sign.sign_pdf(pdf, vendor_signer, field_name=sign.VENDOR_FIELD, reason="test", tsa_url="http://127.0.0.1:9/tsa")
