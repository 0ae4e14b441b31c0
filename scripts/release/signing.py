"""Signing a release with OpenSSF model-signing, key-based and offline: every file of the release
directory, manifest included, hashed (sha256) into an in-toto statement, signed with an elliptic-curve
private key into SIGNATURE (a Sigstore bundle, the library's format), and checked with the public key.

The signature covers what the manifest cannot cover itself: an edit to a graph and to the manifest's
hashes together, a rewritten provenance, a loosened threshold. Keys are PEM files a team makes once
(`make keys`); the private key never enters the release, dvc.lock or a log, only its public fingerprint.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import stat
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from scripts.checkpoint.snapshot import sha256_file
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record

if TYPE_CHECKING:
    from scripts.pipeline.mappings import FileDigests, ForeignJson

SIGNATURE = "model.sig"  # the library's own default name for a model's signature
PASSWORD_ENV = "CLEF_SIGNING_KEY_PASSWORD"
PRIVATE_KEY, PUBLIC_KEY = "release.key", "release.pub"
CURVES = ("secp256r1", "secp384r1", "secp521r1")  # the ones model-signing accepts (Sigstore's specs)


def password_set() -> bool:
    return bool(os.environ.get(PASSWORD_ENV))


def _password() -> bytes | None:
    value = os.environ.get(PASSWORD_ENV)
    return value.encode() if value else None


def load_private_key(path: str | os.PathLike, repo: Path | None = None):
    """The signing key at `path`, or one line saying why it cannot sign: missing, inside the repository
    (where a `git add` would publish it), not a PEM private key, encrypted without the password in
    $CLEF_SIGNING_KEY_PASSWORD, or not on a curve model-signing accepts."""
    from cryptography.hazmat.primitives import serialization

    path = Path(path).expanduser()
    if not path.is_file():
        raise ClefError(f"release.signing_key: no key file {path}")
    if repo is not None and path.resolve().is_relative_to(repo.resolve()):
        raise ClefError(f"release.signing_key {path} lies inside the repository: keep private keys outside it")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), _password())
    except TypeError:  # encrypted without a password, or a password for an unencrypted key
        raise ClefError(
            f"release.signing_key {path}: "
            + (
                f"set ${PASSWORD_ENV} only for an encrypted key"
                if _password()
                else f"the key is encrypted: put its password in ${PASSWORD_ENV}"
            )
        ) from None
    except ValueError:
        what = "a wrong password or not" if _password() else "not"
        raise ClefError(f"release.signing_key {path}: {what} a PEM private key") from None
    check_curve(key, path)
    return key


def check_curve(key, path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    public = key.public_key() if hasattr(key, "public_key") else key
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name not in CURVES:
        kind = public.curve.name if isinstance(public, ec.EllipticCurvePublicKey) else type(public).__name__
        raise ClefError(f"{path}: a {kind} key; model-signing signs with elliptic-curve keys on {', '.join(CURVES)}")


def load_public_key(path: str | os.PathLike):
    """A verifying key: a PEM public key on an accepted curve; a private key given here is refused (it
    belongs on the signing machine only)."""
    from cryptography.hazmat.primitives import serialization

    path = Path(path).expanduser()
    if not path.is_file():
        raise ClefError(f"--key: no key file {path}")
    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        raise ClefError(f"--key {path} is a private key: give the public key ({PUBLIC_KEY})")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ClefError(f"--key {path} is not a PEM public key") from None
    check_curve(key, path)
    return key


def fingerprint(public_key) -> str:
    """`sha256:<hex>` of the key's DER SubjectPublicKeyInfo: what names a key in manifests and output."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def tool() -> str:
    return f"model-signing {metadata.version('model-signing')}"


@dataclasses.dataclass(frozen=True)
class Unsigned(Record):
    """The manifest's `signing` entry of an unsigned release, and why it is not signed."""

    signed: bool
    why: str


@dataclasses.dataclass(frozen=True)
class Signed(Record):
    """The manifest's `signing` entry of a signed release: the signature file, the key that made it,
    the tool, and what the signature covers."""

    signed: bool
    signature: str
    key_fingerprint: str
    tool: str
    covers: str


def section(private_key) -> Signed | Unsigned:
    """The manifest's `signing` entry for a release signed with `private_key` (None: unsigned)."""
    if private_key is None:
        return Unsigned(False, "params.yaml release.signing_key is not set")
    return Signed(
        True,
        SIGNATURE,
        fingerprint(private_key.public_key()),
        tool(),
        f"every file of the release but {SIGNATURE}, manifest included, by sha256",
    )


def _hashing(root: Path):
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[root / SIGNATURE], ignore_git_paths=False)


def sign(root: Path, key_path: str | os.PathLike, name: str) -> None:
    """Sign directory `root` into root/SIGNATURE with the private key at `key_path`; `name` is the
    statement's subject (the release's name, not the build directory's)."""
    from model_signing import manifest
    from model_signing._signing import sign_ec_key, signing

    # model-signing 1.0.1's public signing.Config() builds a Sigstore signer first, which fetches
    # Sigstore's trust root over the network; the key signer it is then replaced by needs none. So
    # the three steps of Config.sign are taken here: hash, make the payload, sign with the key.
    hashed = _hashing(root).hash(root)
    items = [manifest.FileManifestItem(path=Path(d.identifier), digest=d.digest) for d in hashed.resource_descriptors()]
    named = manifest.Manifest(name, items, manifest.SerializationType.from_args(hashed.serialization_type))
    signer = sign_ec_key.Signer(Path(key_path).expanduser(), _password())
    signer.sign(signing.Payload(named)).write(root / SIGNATURE)


def _bundle(root: Path) -> ForeignJson:
    """SIGNATURE as JSON (a Sigstore bundle); {} when it is unreadable or not a JSON object."""
    try:
        bundle = json.loads((root / SIGNATURE).read_text())
        return bundle if isinstance(bundle, dict) else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}


def claimed_key(root: Path) -> str | None:
    """The fingerprint of the public key the bundle names (what it claims, checked by verify only)."""
    from cryptography.hazmat.primitives import serialization

    try:
        pem = _bundle(root)["verificationMaterial"]["publicKey"]["rawBytes"]
        return fingerprint(serialization.load_pem_public_key(base64.b64decode(pem)))
    except (KeyError, TypeError, ValueError):
        return None


def signed_files(root: Path) -> FileDigests:
    """{path: sha256} the bundle's statement lists (trusted only once verify() has passed the signature)."""
    payload = json.loads(base64.b64decode(_bundle(root)["dsseEnvelope"]["payload"]))
    return {r["name"]: r["digest"] for r in payload["predicate"]["resources"]}


def differences(root: Path) -> list[str]:
    """The files that differ from the signed statement, one line each."""
    signed = signed_files(root)
    present = {str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and f != root / SIGNATURE}
    lines = [f"missing file: {n} (signed, not present)" for n in sorted(set(signed) - present)]
    lines += [
        f"changed file: {n} (not what was signed)"
        for n in sorted(set(signed) & present)
        if sha256_file(root / n) != signed[n]
    ]
    lines += [f"extra file: {n} (not signed)" for n in sorted(present - set(signed))]
    return lines


def verify(root: Path, public_key_path: str | os.PathLike) -> list[str]:
    """Check root/SIGNATURE with the public key: [] when it verifies and every file is what was signed;
    else one line per problem (wrong key or an altered signature; each file added, removed or changed)."""
    from cryptography.exceptions import InvalidSignature
    from model_signing import verifying

    root = Path(root)
    key = load_public_key(public_key_path)
    if not (root / SIGNATURE).is_file():
        raise ClefError(f"{root} has no {SIGNATURE}")
    if "dsseEnvelope" not in _bundle(root):
        return [f"{SIGNATURE} is not a model-signing bundle (no JSON DSSE envelope)"]
    config = verifying.Config().use_elliptic_key_verifier(public_key=Path(public_key_path).expanduser())
    try:
        config.set_hashing_config(_hashing(root)).verify(root, root / SIGNATURE)
    except InvalidSignature:
        claimed = claimed_key(root)
        by = f" (the bundle names key {claimed})" if claimed and claimed != fingerprint(key) else ""
        return [
            f"{SIGNATURE} does not verify with key {fingerprint(key)}{by}: another key signed it, or it was altered"
        ]
    except ValueError as exc:
        if str(exc) == "Signature mismatch":
            return [f"signature: {line}" for line in differences(root)] or [
                "signature: the files differ from what was signed"
            ]
        message = " ".join(str(exc).split())[:200]
        if message.startswith("Invalid sigstore bundle"):
            return [f"{SIGNATURE} is not a model-signing bundle: {message}"]
        return [f"signature: {message}"]  # e.g. a symlink in the release
    except Exception as exc:  # noqa: BLE001  (a damaged bundle fails in the base64 or protobuf layer)
        return [f"{SIGNATURE} is not a model-signing bundle: {type(exc).__name__}"]
    return []


def make_keys(directory: Path, repo: Path | None = None) -> tuple[Path, Path]:
    """A new P-256 key pair in `directory`: PRIVATE_KEY (mode 0600; encrypted with $CLEF_SIGNING_KEY_PASSWORD
    when it is set) and PUBLIC_KEY. Refuses to overwrite a key or to write inside the repository."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = Path(directory).expanduser()
    if repo is not None and directory.resolve().is_relative_to(repo.resolve()):
        raise ClefError(f"{directory} lies inside the repository: keep private keys outside it")
    private, public = directory / PRIVATE_KEY, directory / PUBLIC_KEY
    for path in (private, public):
        if path.exists():
            raise ClefError(f"{path} exists: not overwriting a key (move it away first)")
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    password = _password()
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
