"""A throwaway CA and a leaf certificate for the Google storage hosts, made at start-up, never committed and
never trusted system-wide (only through CURL_CA_BUNDLE in the emulator's environment)."""

from __future__ import annotations

import datetime
import os

from scripts.emulator.proxy import GOOGLE_HOSTS


def make_certificates(directory: str) -> tuple[str, str, str]:
  """A throwaway CA and a leaf certificate for the Google storage hosts; returns (ca, cert, key) paths."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import NameOID  # pylint: disable=g-import-not-at-top

  now = datetime.datetime.now(datetime.timezone.utc)
  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vertex-tf-trainer throwaway test CA")])
  ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256()))
  leaf_key = ec.generate_private_key(ec.SECP256R1())
  leaf = (x509.CertificateBuilder()
          .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]))
          .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False)
          .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
          .sign(ca_key, hashes.SHA256()))
  paths = tuple(os.path.join(directory, name) for name in ("ca.pem", "leaf.pem", "leaf.key"))
  with open(paths[0], "wb") as f:
    f.write(ca.public_bytes(serialization.Encoding.PEM))
  with open(paths[1], "wb") as f:
    f.write(leaf.public_bytes(serialization.Encoding.PEM))
  with open(paths[2], "wb") as f:
    f.write(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
  return paths  # type: ignore[return-value]
