"""Private albums (SPEC 17): CloudFront signed cookies that open one album's variants.

With the stack's CdnPublicKeyPem set, the distribution serves a variant only to a request that
carries the three cookies of a policy covering it. An app's backend, having checked that its user
may see the album, asks for them and sets them on its answer::

    from photo_publish import bootstrap, serving

    cookies = serving.album_cookies(bootstrap.settings(), bootstrap.cdn_signing_key(), album_id)
    for header in cookies.set_cookie_headers(domain="example.com"):
        response.headers.add("Set-Cookie", header)

The policy is botocore's (CloudFrontSigner), signed RSA-SHA1 with PKCS#1 v1.5 as CloudFront
verifies it; the private key is read from Secrets Manager once per container (bootstrap).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit
from uuid import UUID

from botocore.signers import CloudFrontSigner
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from photo_publish.keys import parse_uuid
from photo_publish.settings import InvalidSettings, Settings

# CloudFront's names for a custom policy's cookies, in the order of its documentation.
POLICY, SIGNATURE, KEY_PAIR_ID = "CloudFront-Policy", "CloudFront-Signature", "CloudFront-Key-Pair-Id"


@dataclass(frozen=True, slots=True)
class SigningKey:
    """The private half of a key of the distribution's trusted key group, and that key's id."""

    key_pair_id: str
    private_key: rsa.RSAPrivateKey

    @classmethod
    def from_pem(cls, key_pair_id: str, pem: str | bytes) -> SigningKey:
        key = serialization.load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            # CloudFront's public keys are RSA 2048 (or ECDSA for signed URLs only): cookies are RSA.
            raise InvalidSettings("CDN_PRIVATE_KEY_SECRET_ARN must hold an RSA private key (PEM)")
        return cls(key_pair_id, key)

    def sign(self, message: bytes) -> bytes:
        """RSA-SHA1, PKCS#1 v1.5: what CloudFront verifies a policy's signature with."""
        return self.private_key.sign(message, padding.PKCS1v15(), hashes.SHA1())


@dataclass(frozen=True, slots=True)
class AlbumCookies:
    """The three cookies, by name, that open `resource` until `expires_at`; `path` is the album's
    variants prefix, the cookies' Path (a browser then keeps one set per album side by side)."""

    cookies: dict[str, str]
    resource: str
    path: str
    expires_at: datetime

    def set_cookie_headers(self, *, domain: str | None = None) -> list[str]:
        """Set-Cookie values: Secure and HttpOnly, expiring with the policy. `domain` is the app's
        (the CDN's host must be under it, CdnDomainName): without one, they are the host's alone."""
        expires = self.expires_at.strftime("%a, %d %b %Y %H:%M:%S GMT")
        attributes = [f"Path={self.path}", f"Expires={expires}", "Secure", "HttpOnly", "SameSite=Lax"]
        if domain:
            attributes.insert(0, f"Domain={domain}")
        return ["; ".join([f"{name}={value}", *attributes]) for name, value in self.cookies.items()]


def album_cookies(
    settings: Settings,
    key: SigningKey,
    album_id: str | UUID,
    *,
    expires_in: timedelta = timedelta(hours=1),
    now: datetime | None = None,
) -> AlbumCookies:
    """The signed cookies that open `{VARIANT_BASE_URL}/{stage}/albums/{albumId}/variants/*` (every
    variant of every photo of that album, no other album) for `expires_in`."""
    if not settings.variant_base_url:
        raise InvalidSettings("VARIANT_BASE_URL is required: the cookies' policy names the CDN's URL")
    if expires_in <= timedelta(0):
        raise ValueError(f"expires_in must be positive, got {expires_in}")
    album = album_id if isinstance(album_id, UUID) else parse_uuid(album_id)
    path = f"/{settings.stage}/albums/{album}/variants/"
    resource = f"{settings.variant_base_url.rstrip('/')}{path}*"
    # Whole seconds: the policy's DateLessThan is an epoch second, and so is the cookies' expiry.
    expires_at = ((now or datetime.now(UTC)) + expires_in).astimezone(UTC).replace(microsecond=0)

    signer = CloudFrontSigner(key.key_pair_id, key.sign)
    policy = signer.build_policy(resource, expires_at)
    # botocore's public call signs the policy and encodes policy and signature in CloudFront's URL-
    # safe base64 (+ to -, = to _, / to ~), which the cookies use too: read them back from its query.
    signed = dict(parse_qsl(urlsplit(signer.generate_presigned_url(resource, policy=policy)).query))
    cookies = {POLICY: signed["Policy"], SIGNATURE: signed["Signature"], KEY_PAIR_ID: signed["Key-Pair-Id"]}
    return AlbumCookies(cookies, resource, path, expires_at)
