"""Private albums (SPEC 17): the signed cookies of one album, as CloudFront reads and verifies them.

The private key is read from Secrets Manager (moto's server, over HTTP) by the bootstrap, as in a
container; the test checks the cookies with the public half only, the way CloudFront does: the
policy's statement (Resource, DateLessThan) and an RSA-SHA1 PKCS#1 v1.5 signature over its bytes.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from photo_publish import bootstrap, serving
from photo_publish.keys import original_key, variant_key
from photo_publish.settings import InvalidSettings

BASE_URL = "https://d111111abcdef8.cloudfront.net"
KEY_PAIR_ID = "K2JCJMDEHXQW5F"


def cloudfront_b64decode(text: str) -> bytes:
    """CloudFront's URL-safe base64 (- for +, _ for =, ~ for /) back to bytes."""
    return base64.b64decode(text.translate(str.maketrans("-_~", "+=/")), validate=True)


@pytest.fixture(scope="module")
def private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def signing_secret(
    aws_endpoint: None, private_key: rsa.RSAPrivateKey, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The private half in a Secrets Manager secret, and a container's environment naming it."""
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    secrets = boto3.client("secretsmanager")
    arn = secrets.create_secret(Name=f"photo-publish-cdn-{uuid.uuid4().hex[:8]}", SecretString=pem)["ARN"]
    environment = {
        # Never connected to: the cookies need no database.
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "PHOTO_BUCKET": "photo-publish-test",
        "STAGE": "dev",
        "VARIANT_BASE_URL": BASE_URL,
        "CDN_KEY_PAIR_ID": KEY_PAIR_ID,
        "CDN_PRIVATE_KEY_SECRET_ARN": arn,
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    bootstrap.reset()
    yield arn
    bootstrap.reset()
    with contextlib.suppress(secrets.exceptions.ResourceNotFoundException):  # a test deleted it
        secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)


def test_an_albums_cookies_open_its_variants_until_their_expiry_signed_by_the_secrets_key(
    signing_secret: str, private_key: rsa.RSAPrivateKey
) -> None:
    # GIVEN an album, and a container whose key's private half is in Secrets Manager
    album, other_album, photo = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = datetime(2030, 5, 17, 12, 0, 0, 250_000, tzinfo=UTC)

    # WHEN the app asks for the album's cookies for two hours
    cookies = serving.album_cookies(
        bootstrap.settings(), bootstrap.cdn_signing_key(), str(album), expires_in=timedelta(hours=2), now=now
    )

    # THEN there are CloudFront's three, and the key pair is the stack's public key
    assert set(cookies.cookies) == {"CloudFront-Policy", "CloudFront-Signature", "CloudFront-Key-Pair-Id"}
    assert cookies.cookies["CloudFront-Key-Pair-Id"] == KEY_PAIR_ID
    # their values need no escaping in a cookie: CloudFront's alphabet, no +, / or =
    for value in cookies.cookies.values():
        assert set(value) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_~")

    # AND the policy is one statement: this album's variants, until now + 2 h (whole seconds)
    policy_bytes = cloudfront_b64decode(cookies.cookies["CloudFront-Policy"])
    policy: dict[str, Any] = json.loads(policy_bytes)
    (statement,) = policy["Statement"]
    assert statement["Resource"] == f"{BASE_URL}/dev/albums/{album}/variants/*"
    assert statement["Condition"] == {
        "DateLessThan": {"AWS:EpochTime": int(datetime(2030, 5, 17, 14, 0, 0, tzinfo=UTC).timestamp())}
    }
    assert cookies.expires_at == datetime(2030, 5, 17, 14, 0, 0, tzinfo=UTC)

    # AND CloudFront's wildcard matches every variant of the album, not another album's nor an original
    def url(key: str) -> str:
        return f"{BASE_URL}/{key}"

    for kind in ("thumb", "browse"):
        assert fnmatch.fnmatchcase(
            url(variant_key("dev", album, photo, version=1, kind=kind, ext="webp")), statement["Resource"]
        )
    assert fnmatch.fnmatchcase(
        url(variant_key("dev", album, photo, version=2, kind="thumb", ext="webp")), statement["Resource"]
    )
    assert not fnmatch.fnmatchcase(
        url(variant_key("dev", other_album, photo, version=1, kind="thumb", ext="webp")),
        statement["Resource"],
    )
    assert not fnmatch.fnmatchcase(url(original_key("dev", album, photo, "a.jpg")), statement["Resource"])

    # AND the signature verifies with the public key over the policy's exact bytes, RSA-SHA1 PKCS#1 v1.5
    signature = cloudfront_b64decode(cookies.cookies["CloudFront-Signature"])
    public_key = private_key.public_key()
    public_key.verify(signature, policy_bytes, padding.PKCS1v15(), hashes.SHA1())
    # ...and over nothing else: another album's policy does not verify with it
    forged = policy_bytes.replace(str(album).encode(), str(other_album).encode())
    with pytest.raises(InvalidSignature):
        public_key.verify(signature, forged, padding.PKCS1v15(), hashes.SHA1())

    # AND the Set-Cookie headers scope each cookie to the album's variants, Secure, until the expiry
    headers = cookies.set_cookie_headers(domain="example.com")
    assert len(headers) == 3
    for header in headers:
        assert f"; Domain=example.com; Path=/dev/albums/{album}/variants/;" in header
        assert "; Expires=Fri, 17 May 2030 14:00:00 GMT; Secure; HttpOnly" in header


def test_the_private_key_is_read_from_secrets_manager_once_per_container(signing_secret: str) -> None:
    # GIVEN a container that signed once
    first = bootstrap.cdn_signing_key()

    # WHEN the secret is gone (or Secrets Manager unreachable) for its next request
    boto3.client("secretsmanager").delete_secret(SecretId=signing_secret, ForceDeleteWithoutRecovery=True)

    # THEN it signs with the key it read, asking nothing
    assert bootstrap.cdn_signing_key() is first
    assert serving.album_cookies(bootstrap.settings(), first, str(uuid.uuid4())).cookies


def test_cookies_need_the_cdns_url_a_canonical_album_id_and_a_future_expiry(
    signing_secret: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = bootstrap.cdn_signing_key()
    with pytest.raises(ValueError, match="not a UUID"):
        serving.album_cookies(bootstrap.settings(), key, "../../originals")
    with pytest.raises(ValueError, match="positive"):
        serving.album_cookies(bootstrap.settings(), key, str(uuid.uuid4()), expires_in=timedelta(0))
    monkeypatch.delenv("VARIANT_BASE_URL")
    bootstrap.reset()
    with pytest.raises(InvalidSettings, match="VARIANT_BASE_URL"):
        serving.album_cookies(bootstrap.settings(), key, str(uuid.uuid4()))
    monkeypatch.delenv("CDN_PRIVATE_KEY_SECRET_ARN")
    bootstrap.reset()
    with pytest.raises(InvalidSettings, match="CDN_PRIVATE_KEY_SECRET_ARN"):
        bootstrap.cdn_signing_key()
