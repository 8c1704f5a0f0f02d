from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import pytest

from certagent.certs.keycrypt import (
    KEY_BYTES,
    NONCE_BYTES,
    TOKEN_PREFIX,
    KeyRing,
    decrypt,
    encrypt,
    generate_key_line,
    needs_rotation,
    reencrypt,
    token_kid,
)
from certagent.errors import ConfigError, KeyDecryptError, StoreError
from certagent.testing.certs import key_pem, make_key

K1 = bytes(range(32))
K2 = bytes(range(100, 132))
AAD = b"cert:a.example.test"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def ring() -> KeyRing:
    return KeyRing(keys=(("k1", K1),), current="k1")


@pytest.fixture
def pem() -> bytes:
    return key_pem(make_key())


def assert_secret_free(exc: BaseException, *secrets: bytes) -> None:
    """No message in the chain carries key bytes, their base64, or PEM key text."""
    cause: BaseException | None = exc
    while cause is not None:
        message = str(cause)
        assert "PRIVATE KEY" not in message
        for secret in secrets:
            assert b64(secret) not in message
            assert secret.hex() not in message
            assert repr(secret) not in message
        cause = cause.__cause__


# --- round trip ---------------------------------------------------------------------------------


def test_round_trip(ring: KeyRing, pem: bytes) -> None:
    token = encrypt(ring, pem, AAD)
    assert token.startswith(b"cak1:k1:")
    assert pem not in token
    assert b"PRIVATE KEY" not in token
    assert decrypt(ring, token, AAD) == pem


def test_token_layout(ring: KeyRing) -> None:
    nonce = bytes(NONCE_BYTES)
    token = encrypt(ring, b"secret", AAD, nonce=nonce)
    prefix, kid, payload = token.split(b":")
    assert prefix + b":" == TOKEN_PREFIX
    assert kid == b"k1"
    raw = base64.b64decode(payload, validate=True)
    assert raw[:NONCE_BYTES] == nonce
    assert len(raw) == NONCE_BYTES + len(b"secret") + 16
    # Deterministic with a fixed nonce; random otherwise.
    assert encrypt(ring, b"secret", AAD, nonce=nonce) == token
    assert encrypt(ring, b"secret", AAD) != encrypt(ring, b"secret", AAD)


def test_empty_plaintext_and_empty_aad(ring: KeyRing) -> None:
    assert decrypt(ring, encrypt(ring, b"", b""), b"") == b""


def test_bad_nonce_length(ring: KeyRing) -> None:
    with pytest.raises(ValueError, match="12 bytes"):
        encrypt(ring, b"x", AAD, nonce=b"short")


def test_decrypt_error_is_a_store_error() -> None:
    assert issubclass(KeyDecryptError, StoreError)


# --- decryption failures ------------------------------------------------------------------------


def test_wrong_aad_fails(ring: KeyRing, pem: bytes) -> None:
    token = encrypt(ring, pem, AAD)
    with pytest.raises(KeyDecryptError, match="'k1'") as info:
        decrypt(ring, token, b"cert:b.example.test")
    assert_secret_free(info.value, K1, pem)


def test_unknown_kid(ring: KeyRing, pem: bytes) -> None:
    other = KeyRing(keys=(("k9", K2),), current="k9")
    token = encrypt(other, pem, AAD)
    with pytest.raises(KeyDecryptError) as info:
        decrypt(ring, token, AAD)
    message = str(info.value)
    assert "'k9'" in message
    assert "k1" in message  # what the ring has
    assert "add that key back" in message
    assert_secret_free(info.value, K1, K2, pem)


def test_same_kid_different_key_fails(ring: KeyRing, pem: bytes) -> None:
    impostor = KeyRing(keys=(("k1", K2),), current="k1")
    with pytest.raises(KeyDecryptError, match="'k1'") as info:
        decrypt(impostor, encrypt(ring, pem, AAD), AAD)
    assert_secret_free(info.value, K1, K2, pem)


def _flip(token: bytes, index: int) -> bytes:
    prefix, kid, payload = token.split(b":")
    raw = bytearray(base64.b64decode(payload))
    raw[index] ^= 0x01
    return prefix + b":" + kid + b":" + base64.b64encode(bytes(raw))


@pytest.mark.parametrize("index", [0, NONCE_BYTES, NONCE_BYTES + 5, -1], ids=str)
def test_tampered_token_fails(ring: KeyRing, pem: bytes, index: int) -> None:
    token = _flip(encrypt(ring, pem, AAD), index)
    with pytest.raises(KeyDecryptError, match="altered") as info:
        decrypt(ring, token, AAD)
    assert_secret_free(info.value, K1, pem)


def test_kid_swapped_in_token_fails(pem: bytes) -> None:
    two = KeyRing(keys=(("k2", K2), ("k1", K1)), current="k2")
    token = encrypt(two, pem, AAD)
    swapped = token.replace(b"cak1:k2:", b"cak1:k1:", 1)
    with pytest.raises(KeyDecryptError, match="'k1'"):
        decrypt(two, swapped, AAD)


@pytest.mark.parametrize(
    ("token", "match"),
    [
        (b"", "not a token"),
        (b"cak3:k1:AAAA", "not a token"),
        (b"-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n", "plaintext PEM"),
        (b"cak1:", "no valid key id"),
        (b"cak1:k1", "no valid key id"),
        (b"cak1::AAAA", "no valid key id"),
        (b"cak1:k 1:AAAA", "no valid key id"),
        (b"cak1:\xff\xfe:AAAA", "no valid key id"),
        (b"cak1:k1:not base64!", "not valid base64"),
        (b"cak1:k1:" + base64.b64encode(bytes(27)), "truncated"),
    ],
    ids=[
        "empty",
        "other-version",
        "plaintext-pem",
        "no-kid",
        "no-separator",
        "empty-kid",
        "space-in-kid",
        "binary-kid",
        "bad-base64",
        "truncated",
    ],
)
def test_malformed_tokens(ring: KeyRing, token: bytes, match: str) -> None:
    with pytest.raises(KeyDecryptError, match=match) as info:
        decrypt(ring, token, AAD)
    assert_secret_free(info.value, K1)


def test_plaintext_pem_is_not_echoed(ring: KeyRing, pem: bytes) -> None:
    with pytest.raises(KeyDecryptError) as info:
        decrypt(ring, pem, AAD)
    assert_secret_free(info.value, pem)
    body = pem.splitlines()[1].decode()
    assert body not in str(info.value)


# --- rotation -------------------------------------------------------------------------------------


def test_rotation_detection_and_reencrypt(pem: bytes) -> None:
    old = KeyRing(keys=(("k1", K1),), current="k1")
    token = encrypt(old, pem, AAD)
    assert not needs_rotation(old, token)
    assert token_kid(token) == "k1"

    new = KeyRing.from_text(f"k2:{b64(K2)}\nk1:{b64(K1)}\n")
    assert new.current == "k2"
    assert needs_rotation(new, token)
    assert decrypt(new, token, AAD) == pem  # old tokens still decrypt

    rotated = reencrypt(new, token, AAD)
    assert token_kid(rotated) == "k2"
    assert not needs_rotation(new, rotated)
    assert decrypt(new, rotated, AAD) == pem
    with pytest.raises(KeyDecryptError, match="'k2'"):
        decrypt(old, rotated, AAD)


def test_reencrypt_keeps_the_record_binding(pem: bytes) -> None:
    new = KeyRing(keys=(("k2", K2), ("k1", K1)), current="k2")
    token = encrypt(KeyRing(keys=(("k1", K1),), current="k1"), pem, AAD)
    rotated = reencrypt(new, token, AAD)
    with pytest.raises(KeyDecryptError):
        decrypt(new, rotated, b"cert:other.example.test")
    with pytest.raises(KeyDecryptError):
        reencrypt(new, token, b"cert:other.example.test")


def test_needs_rotation_rejects_garbage(ring: KeyRing) -> None:
    with pytest.raises(KeyDecryptError):
        needs_rotation(ring, b"garbage")


# --- key ring and key file ------------------------------------------------------------------------


def test_from_text_with_comments_and_blank_lines() -> None:
    text = (
        "# certagent data keys\n"
        "\n"
        f"  k2 : {b64(K2)}   # added 2025-01-01\n"
        f"k1:{b64(K1)}\r\n"
        "   # old keys below\n"
    )
    ring = KeyRing.from_text(text)
    assert ring.current == "k2"
    assert ring.kids == ("k2", "k1")
    assert ring.key("k1") == K1
    assert ring.key("k2") == K2
    assert ring.key("k3") is None


def test_repr_hides_keys() -> None:
    ring = KeyRing(keys=(("k1", K1),), current="k1")
    assert b64(K1) not in repr(ring)
    assert repr(K1) not in repr(ring)
    assert "k1" in repr(ring)


def test_ring_is_frozen() -> None:
    ring = KeyRing(keys=(("k1", K1),), current="k1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ring.current = "k2"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "holds no key.*certagent keys generate"),
        ("# only a comment\n\n", "holds no key"),
        (f"{b64(K1)}\n", "line 1: expected kid:base64key.*certagent keys generate"),
        ("k1:\n", "line 1: expected kid:base64key"),
        (f":{b64(K1)}\n", "line 1: expected kid:base64key"),
        (f"# header\nk/1:{b64(K1)}\n", "line 2: a key id is"),
        (f"{'k' * 17}:{b64(K1)}\n", "line 1: a key id is"),
        ("k1:not*base64\n", "line 1: key 'k1' is not valid base64.*keys generate k1"),
        (f"k1:{b64(bytes(16))}\n", "line 1: key 'k1' is 16 bytes; AES-256 needs 32"),
        (f"k1:{b64(bytes(33))}\n", "key 'k1' is 33 bytes"),
        (f"k1:{b64(K1)}\nk1:{b64(K2)}\n", "line 2: key id 'k1' appears twice"),
    ],
    ids=[
        "empty",
        "comments-only",
        "no-kid",
        "no-key",
        "empty-kid",
        "bad-kid",
        "long-kid",
        "bad-base64",
        "short-key",
        "long-key",
        "duplicate-kid",
    ],
)
def test_bad_key_file_lines(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        KeyRing.from_text(text, source="keys.txt")
    assert str(info.value).startswith("keys.txt")
    assert_secret_free(info.value, K1, K2)


def test_errors_never_echo_the_line() -> None:
    secret = b64(K1)
    for text in (f"{secret}\n", f"k1:{secret}x\n", f"k1:{secret[:-4]}\n", f"k 1:{secret}\n"):
        with pytest.raises(ConfigError) as info:
            KeyRing.from_text(text)
        assert secret[:20] not in str(info.value)


@pytest.mark.parametrize(
    ("keys", "current", "match"),
    [
        ((), "k1", "empty"),
        ((("k1", K1),), "k2", "'k2' is not in the key ring"),
        ((("k1", K1), ("k1", K2)), "k1", "appears twice"),
        ((("k1", b"short"),), "k1", "5 bytes"),
        ((("bad kid", K1),), "bad kid", "a key id is"),
    ],
)
def test_ring_constructor_validates(
    keys: tuple[tuple[str, bytes], ...], current: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        KeyRing(keys=keys, current=current)


def test_from_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"k1:{b64(K1)}\n")
    assert KeyRing.from_file(path) == KeyRing(keys=(("k1", K1),), current="k1")
    assert KeyRing.from_file(str(path)).current == "k1"


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=r"nope does not exist.*certagent keys generate"):
        KeyRing.from_file(missing)
    with pytest.raises(ConfigError, match="cannot read key file"):
        KeyRing.from_file(tmp_path)  # a directory
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        KeyRing.from_file(binary)
    short = tmp_path / "short"
    short.write_text(f"# keys\nk1:{b64(bytes(31))}\n")
    with pytest.raises(ConfigError, match=r"short, line 2: key 'k1' is 31 bytes"):
        KeyRing.from_file(short)


# --- generate_key_line ----------------------------------------------------------------------------


def test_generate_key_line_round_trips() -> None:
    line = generate_key_line("k7")
    kid, _, encoded = line.partition(":")
    assert kid == "k7"
    assert "\n" not in line
    assert len(base64.b64decode(encoded, validate=True)) == KEY_BYTES
    ring = KeyRing.from_text(line + "\n")
    assert decrypt(ring, encrypt(ring, b"x", AAD), AAD) == b"x"
    assert generate_key_line("k7") != line


@pytest.mark.parametrize("kid", ["", "k:1", "k 1", "-k", "k#1", "x" * 17, "ké"])
def test_generate_key_line_rejects_bad_kids(kid: str) -> None:
    with pytest.raises(ConfigError, match="key id"):
        generate_key_line(kid)


def test_generated_keys_are_random() -> None:
    keys = {generate_key_line("k1") for _ in range(8)}
    assert len(keys) == 8


def test_binary_tokens_round_trip_and_keep_their_form_when_reencrypted(ring: KeyRing) -> None:
    token = encrypt(ring, b"secret", b"aad", binary=True)
    assert token.startswith(b"cak2:k1:") and len(token) == len(b"cak2:k1:") + 12 + 6 + 16
    assert decrypt(ring, token, b"aad") == b"secret"
    assert token_kid(token) == "k1"
    with pytest.raises(KeyDecryptError, match="cannot decrypt"):
        decrypt(ring, token, b"other aad")
    with pytest.raises(KeyDecryptError, match="truncated"):
        decrypt(ring, token[:20], b"aad")
    assert reencrypt(ring, token, b"aad").startswith(b"cak2:")
    assert reencrypt(ring, encrypt(ring, b"s", b"aad"), b"aad").startswith(b"cak1:")
