"""Release signing (scripts/release/signing.py) on a small directory: a signed tree verifies with its
public key and fails, naming what changed, on every edit, on another key and on an altered signature;
keys that cannot sign or verify are refused with one line. Also the drift check `clef verify` applies
to reference records, and the release's two outputs swapped in together or not at all."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import stat
from pathlib import Path

import pytest

from scripts.checkpoint.snapshot import sha256_file
from scripts.pipeline import atomic
from scripts.pipeline.errors import ClefError
from scripts.release import reader, signing
from scripts.release.manifest import Reference

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def keys(tmp_path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.delenv(signing.PASSWORD_ENV, raising=False)
    return signing.make_keys(tmp_path / "keys")


@pytest.fixture
def signed(tmp_path, keys) -> Path:
    """A release-shaped directory signed with `keys`."""
    root = tmp_path / "release"
    (root / "rows").mkdir(parents=True)
    (root / "rows" / "row_L64.tflite").write_bytes(bytes(range(256)) * 64)
    (root / "host").mkdir()
    (root / "host" / "config.json").write_text('{"hidden_size": 8}')
    (root / reader.MANIFEST).write_text('{"threshold": 1e-4}')
    signing.sign(root, keys[0], "clef-test")
    return root


def test_a_signed_release_verifies_and_names_its_key(signed, keys):
    assert signing.verify(signed, keys[1]) == []
    assert signing.claimed_key(signed) == signing.fingerprint(signing.load_public_key(keys[1]))
    statement = json.loads(
        base64.b64decode(json.loads((signed / signing.SIGNATURE).read_text())["dsseEnvelope"]["payload"])
    )
    assert statement["subject"][0]["name"] == "clef-test"  # the release's name, not its build directory's
    assert set(signing.signed_files(signed)) == {"rows/row_L64.tflite", "host/config.json", reader.MANIFEST}


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda r: flip_byte(r / "rows/row_L64.tflite"), "signature: changed file: rows/row_L64.tflite"),
        (lambda r: (r / reader.MANIFEST).write_text('{"threshold": 1}'), "signature: changed file: manifest.json"),
        (lambda r: (r / "host/notes.txt").write_text("x"), "signature: extra file: host/notes.txt"),
        (lambda r: (r / "host/config.json").unlink(), "signature: missing file: host/config.json"),
    ],
)
def test_every_edit_fails_the_signature_naming_the_file(signed, keys, edit, named):
    edit(signed)
    assert signing.verify(signed, keys[1]) == [named + named_suffix(named)]


def named_suffix(named: str) -> str:
    return {"changed": " (not what was signed)", "extra": " (not signed)", "missing": " (signed, not present)"}[
        named.split(": ")[1].split()[0]
    ]


def test_another_key_fails(signed, tmp_path):
    _, other = signing.make_keys(tmp_path / "other")
    (problem,) = signing.verify(signed, other)
    assert f"does not verify with key {signing.fingerprint(signing.load_public_key(other))}" in problem
    assert f"the bundle names key {signing.claimed_key(signed)}" in problem


def test_an_altered_signature_fails(signed, keys):
    bundle = json.loads((signed / signing.SIGNATURE).read_text())
    sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[-1] ^= 0x01
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    (signed / signing.SIGNATURE).write_text(json.dumps(bundle))
    (problem,) = signing.verify(signed, keys[1])
    assert "does not verify with key" in problem


def test_a_rewritten_statement_fails(signed, keys):
    """Someone who edits a graph cannot fix the statement's hash either: the signature covers it."""
    bundle = json.loads((signed / signing.SIGNATURE).read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    flip_byte(signed / "rows/row_L64.tflite")
    for r in statement["predicate"]["resources"]:
        if r["name"] == "rows/row_L64.tflite":
            r["digest"] = sha256_file(signed / "rows/row_L64.tflite")
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (signed / signing.SIGNATURE).write_text(json.dumps(bundle))
    (problem,) = signing.verify(signed, keys[1])
    assert "does not verify with key" in problem


@pytest.mark.parametrize("damage", ["not json", '{"dsseEnvelope": {"payload": "%%%"}}', "[]"])
def test_a_damaged_bundle_is_one_line(signed, keys, damage):
    (signed / signing.SIGNATURE).write_text(damage)
    (problem,) = signing.verify(signed, keys[1])
    assert problem.startswith(f"{signing.SIGNATURE} is not a model-signing bundle") and "\n" not in problem


def test_a_file_named_like_the_signature_elsewhere_is_not_ignored(signed, keys):
    (signed / "rows" / signing.SIGNATURE).write_text("x")
    assert signing.verify(signed, keys[1]) == [f"signature: extra file: rows/{signing.SIGNATURE} (not signed)"]


def test_a_symlink_in_the_release_is_named(signed, keys, tmp_path):
    (tmp_path / "outside").write_text("x")
    (signed / "rows" / "link").symlink_to(tmp_path / "outside")
    (problem,) = signing.verify(signed, keys[1])
    assert problem.startswith("signature: ") and "link" in problem, problem


def test_key_refusals(tmp_path, keys, monkeypatch):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    with pytest.raises(ClefError, match="no key file"):
        signing.load_private_key(tmp_path / "absent.key")
    with pytest.raises(ClefError, match="lies inside the repository"):
        signing.load_private_key(keys[0], repo=tmp_path)
    with pytest.raises(ClefError, match="not a PEM private key"):
        signing.load_private_key(keys[1])
    with pytest.raises(ClefError, match="is a private key: give the public key"):
        signing.load_public_key(keys[0])
    with pytest.raises(ClefError, match="not a PEM public key"):
        signing.load_public_key(write(tmp_path / "junk.pub", b"junk"))
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = rsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ClefError, match="RSAPublicKey key; model-signing signs with elliptic-curve keys"):
        signing.load_private_key(write(tmp_path / "rsa.key", pem))
    k1 = ec.generate_private_key(ec.SECP256K1())
    pem = k1.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ClefError, match="a secp256k1 key"):
        signing.load_private_key(write(tmp_path / "k1.key", pem))
    with pytest.raises(ClefError, match=f"set \\${signing.PASSWORD_ENV} only for an encrypted key"):
        monkeypatch.setenv(signing.PASSWORD_ENV, "pw")
        signing.load_private_key(keys[0])


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_an_encrypted_key_signs_with_its_password(tmp_path, monkeypatch):
    monkeypatch.setenv(signing.PASSWORD_ENV, "correct horse")
    private, public = signing.make_keys(tmp_path / "keys")
    assert b"ENCRYPTED" in private.read_bytes() and stat.S_IMODE(private.stat().st_mode) == 0o600
    root = tmp_path / "r"
    root.mkdir()
    (root / "a").write_text("a")
    signing.sign(root, private, "r")
    assert signing.verify(root, public) == []
    monkeypatch.setenv(signing.PASSWORD_ENV, "wrong")
    with pytest.raises(ClefError, match="a wrong password or not a PEM private key"):
        signing.load_private_key(private)
    monkeypatch.delenv(signing.PASSWORD_ENV)
    with pytest.raises(ClefError, match=f"the key is encrypted: put its password in \\${signing.PASSWORD_ENV}"):
        signing.load_private_key(private)


def test_make_keys_refuses_to_overwrite_or_to_write_inside_the_repository(tmp_path, keys):
    with pytest.raises(ClefError, match="exists: not overwriting a key"):
        signing.make_keys(keys[0].parent)
    with pytest.raises(ClefError, match="lies inside the repository"):
        signing.make_keys(ROOT / "keys", repo=ROOT)
    assert not (ROOT / "keys").exists()
    assert stat.S_IMODE(keys[0].stat().st_mode) == 0o600 and b"ENCRYPTED" not in keys[0].read_bytes()


# ---- the reference records' drift check ----------------------------------------------------------

REFERENCE = Reference("checks/row_L64.safetensors", 2e-6, 1e-4, 4e-6, 1e-4, 10, [2e-6, 4e-6])


@pytest.mark.parametrize(
    "measured, recorded, failing",
    [
        ((1.9e-5, 3.9e-5), {}, []),  # under 10x: passes
        ((2.1e-5, 3.9e-5), {}, ["rel_vs_expected"]),  # over 10x the recorded global figure
        ((1e-6, 4.1e-5), {}, ["rel_per_position_vs_expected"]),
        ((math.nan, 1e-6), {}, ["rel_vs_expected"]),  # NaN never passes
        ((1e-6, math.inf), {}, ["rel_per_position_vs_expected"]),
        ((1e-6, 1e-6), {"max_rel": 0.0, "max_rel_per_position": 0.0}, []),  # floored at float32's epsilon
        ((2e-6, 1e-6), {"max_rel": 0.0, "max_rel_per_position": 0.0}, ["rel_vs_expected"]),
        ((1e-6, 1e-6), {"max_rel": math.nan}, ["rel_vs_expected"]),  # a recorded NaN is no baseline
    ],
)
def test_drift_problems(measured, recorded, failing):
    figures = {"rel_vs_expected": measured[0], "rel_per_position_vs_expected": measured[1]}
    problems = reader.drift_problems(figures, dataclasses.replace(REFERENCE, **recorded))
    assert [p.split()[0].rstrip(":") for p in problems] == failing, problems


# ---- the release and its tarball, swapped in together ----------------------------------------------


def test_swap_in_dirs_replaces_all_or_none(tmp_path):
    finals = [tmp_path / "release", tmp_path / "dist"]
    for d in finals:
        d.mkdir()
        (d / "f").write_text("old")
    built = tmp_path / "release.partial"
    built.mkdir()
    (built / "f").write_text("new")
    with pytest.raises(FileNotFoundError):  # the tarball's build directory is missing: nothing is replaced
        atomic.swap_in_dirs([(built, finals[0]), (tmp_path / "dist.partial", finals[1])])
    assert [(d / "f").read_text() for d in finals] == ["old", "old"] and (built / "f").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["dist", "release", "release.partial"]
    (tmp_path / "dist.partial").mkdir()
    (tmp_path / "dist.partial" / "f").write_text("new")
    atomic.swap_in_dirs([(built, finals[0]), (tmp_path / "dist.partial", finals[1])])
    assert [(d / "f").read_text() for d in finals] == ["new", "new"]
    assert sorted(os.listdir(tmp_path)) == ["dist", "release"]
