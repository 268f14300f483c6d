"""Certificates made with openssl for the TLS tests: CAs, a serving certificate, client ones."""

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
        "-keyout", str(pair.key), "-out", str(pair.cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return pair


def make_cert(directory: Path, ca: KeyPair, cn: str, usage: str, san: str = "") -> KeyPair:
    """A leaf certificate for ``cn`` signed by ``ca``; ``usage`` serverAuth or clientAuth."""
    pair = KeyPair(directory / f"{cn}.crt", directory / f"{cn}.key")
    csr = directory / f"{cn}.csr"
    ext = directory / f"{cn}.ext"
    lines = ["basicConstraints=CA:FALSE", f"extendedKeyUsage={usage}"]
    if san:
        lines.append(f"subjectAltName={san}")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
        "-keyout", str(pair.key), "-out", str(csr),
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(pair.cert),
    )  # fmt: skip
    return pair
