"""A Sigstore instance made in the test: a Fulcio-like CA, a CT log and a Rekor log, each with its own key,
and a signer that makes the bundle actions/attest makes (v0.3, a DSSE envelope, a dsse 0.0.1 log entry with
its inclusion promise and a one-leaf inclusion proof with a signed checkpoint)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

FULCIO = "1.3.6.1.4.1.57264.1."
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _spki(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _der_utf8(text: str) -> bytes:
    raw = text.encode()
    assert len(raw) < 128
    return bytes([0x0C, len(raw)]) + raw


def pae(payload_type: str, payload: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


@dataclass
class Identity:
    """What GitHub's OIDC token says of a workflow job, as Fulcio writes it into the certificate."""
    repository: str = "octo/wheelhouse"
    workflow: str = ".github/workflows/_publish.yml"
    ref: str = "refs/heads/main"
    commit: str = "c" * 40
    run_id: str = "4242"
    attempt: str = "2"
    issuer: str = "https://token.actions.githubusercontent.com"
    server: str = "https://github.com"

    @property
    def san(self) -> str:
        return f"{self.server}/{self.repository}/{self.workflow}@{self.ref}"

    @property
    def run_url(self) -> str:
        return f"{self.server}/{self.repository}/actions/runs/{self.run_id}/attempts/{self.attempt}"

    def extensions(self) -> dict[str, str]:
        return {"8": self.issuer, "9": self.san, "10": self.commit, "11": "github-hosted",
                "12": f"{self.server}/{self.repository}", "13": self.commit, "14": self.ref,
                "18": self.san, "19": self.commit, "20": "push", "21": self.run_url}


@dataclass
class LocalSigstore:
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).replace(microsecond=0))

    def __post_init__(self) -> None:
        self.ca_key = ec.generate_private_key(ec.SECP384R1())
        self.ct_key = ec.generate_private_key(ec.SECP256R1())
        self.rekor_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "wheelhouse test"),
                          x509.NameAttribute(NameOID.COMMON_NAME, "test fulcio")])
        self.ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(self.now - dt.timedelta(days=1)).not_valid_after(self.now + dt.timedelta(days=365))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                key_cert_sign=True, crl_sign=True, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key()), critical=False)
                   .sign(self.ca_key, hashes.SHA384()))

    # ---- the trusted root ----
    def trusted_root(self) -> dict:
        start = (self.now - dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")

        def log(key, url: str) -> dict:
            spki = _spki(key.public_key())
            return {"baseUrl": url, "hashAlgorithm": "SHA2_256",
                    "publicKey": {"rawBytes": _b64(spki), "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                                  "validFor": {"start": start}},
                    "logId": {"keyId": _b64(hashlib.sha256(spki).digest())}}
        return {
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [log(self.rekor_key, "https://rekor.test.invalid")],
            "certificateAuthorities": [{
                "subject": {"organization": "wheelhouse test", "commonName": "test fulcio"},
                "uri": "https://fulcio.test.invalid",
                "certChain": {"certificates": [{"rawBytes": _b64(self.ca.public_bytes(serialization.Encoding.DER))}]},
                "validFor": {"start": start}}],
            "ctlogs": [log(self.ct_key, "https://ctfe.test.invalid")],
            "timestampAuthorities": [],
        }

    def write_trusted_root(self, path: Path) -> Path:
        path.write_text(json.dumps(self.trusted_root()))
        return path

    # ---- a certificate for a workflow identity ----
    def _leaf_builder(self, key, identity: Identity, serial: int) -> x509.CertificateBuilder:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(self.ca.subject)
                   .public_key(key.public_key()).serial_number(serial)
                   .not_valid_before(self.now).not_valid_after(self.now + dt.timedelta(minutes=10))
                   .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                key_cert_sign=False, crl_sign=False, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                                  critical=False)
                   .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity.san)]),
                                  critical=True)
                   .add_extension(x509.UnrecognizedExtension(ObjectIdentifier(FULCIO + "1"), identity.issuer.encode()),
                                  critical=False))
        for number, value in identity.extensions().items():
            builder = builder.add_extension(x509.UnrecognizedExtension(ObjectIdentifier(FULCIO + number),
                                                                       _der_utf8(value)), critical=False)
        return builder

    def _sct_extension(self, tbs_precert: bytes, when: dt.datetime) -> x509.UnrecognizedExtension:
        """RFC 6962 precertificate SCT list with one SCT of the test CT log."""
        issuer_key_hash = hashlib.sha256(_spki(self.ca_key.public_key())).digest()
        millis = int(when.timestamp() * 1000)
        signed = struct.pack("!BBQH", 0, 0, millis, 1) + issuer_key_hash + len(tbs_precert).to_bytes(3, "big") \
            + tbs_precert + struct.pack("!H", 0)
        signature = self.ct_key.sign(signed, ec.ECDSA(hashes.SHA256()))
        log_id = hashlib.sha256(_spki(self.ct_key.public_key())).digest()
        sct = (struct.pack("!B", 0) + log_id + struct.pack("!Q", millis) + struct.pack("!H", 0)
               + struct.pack("!BB", 4, 3) + struct.pack("!H", len(signature)) + signature)
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        octet = bytes([0x04]) + _der_len(len(sct_list)) + sct_list
        return x509.UnrecognizedExtension(ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2"), octet)

    def certificate(self, key, identity: Identity) -> x509.Certificate:
        serial = x509.random_serial_number()
        draft = self._leaf_builder(key, identity, serial).add_extension(
            x509.UnrecognizedExtension(ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2"), b"\x04\x00"), critical=False
        ).sign(self.ca_key, hashes.SHA384())
        tbs_precert = draft.tbs_precertificate_bytes
        return self._leaf_builder(key, identity, serial).add_extension(
            self._sct_extension(tbs_precert, self.now), critical=False).sign(self.ca_key, hashes.SHA384())

    # ---- the bundle ----
    def sign_statement(self, statement: dict, identity: Identity | None = None) -> dict:
        identity = identity or Identity()
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self.certificate(key, identity)
        payload = json.dumps(statement).encode()
        signature = key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
        envelope = {"payload": _b64(payload), "payloadType": PAYLOAD_TYPE, "signatures": [{"sig": _b64(signature)}]}
        return {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                "verificationMaterial": {"certificate": {"rawBytes": _b64(cert.public_bytes(serialization.Encoding.DER))},
                                         "tlogEntries": [self._log_entry(cert, envelope, payload, signature)],
                                         "timestampVerificationData": {}},
                "dsseEnvelope": envelope}

    def _log_entry(self, cert: x509.Certificate, envelope: dict, payload: bytes, signature: bytes) -> dict:
        pem = cert.public_bytes(serialization.Encoding.PEM)
        body = json.dumps({"apiVersion": "0.0.1", "kind": "dsse", "spec": {
            "envelopeHash": {"algorithm": "sha256",
                             "value": hashlib.sha256(json.dumps(envelope, separators=(",", ":")).encode()).hexdigest()},
            "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
            "signatures": [{"signature": _b64(signature), "verifier": _b64(pem)}]}}, separators=(",", ":")).encode()
        spki = _spki(self.rekor_key.public_key())
        log_id = hashlib.sha256(spki).digest()
        integrated = int(self.now.timestamp()) + 1
        promise = rfc8785.dumps({"body": _b64(body), "integratedTime": integrated, "logID": log_id.hex(),
                                 "logIndex": 0})
        root = hashlib.sha256(b"\x00" + body).digest()
        note = f"rekor.test.invalid - 1\n1\n{_b64(root)}\n"
        note_sig = self.rekor_key.sign(note.encode(), ec.ECDSA(hashes.SHA256()))
        checkpoint = f"{note}\n\u2014 rekor.test.invalid {_b64(log_id[:4] + note_sig)}\n"
        return {"logIndex": "0", "logId": {"keyId": _b64(log_id)},
                "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                "integratedTime": str(integrated),
                "inclusionPromise": {"signedEntryTimestamp": _b64(self.rekor_key.sign(promise, ec.ECDSA(hashes.SHA256())))},
                "inclusionProof": {"logIndex": "0", "rootHash": _b64(root), "treeSize": "1", "hashes": [],
                                   "checkpoint": {"envelope": checkpoint}},
                "canonicalizedBody": _b64(body)}


def _der_len(n: int) -> bytes:
    if n < 128:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw
