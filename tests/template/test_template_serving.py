"""Serving (SPEC 17): the CloudFront distribution as template.yaml deploys it, for given parameters.

LocalStack's free edition has no CloudFront (the aws_local deploy runs with Cdn=false), so these
read what CloudFormation would create: what the bucket policy lets CloudFront read (its resource
pattern evaluated against real keys, as IAM matches wildcards), Origin Access Control, HTTPS, the
cache and response headers policies, the private albums' key group and the outputs. cfn-lint and
checkov run on the whole template in test_template.py.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any
from uuid import uuid4

import pytest

from photo_publish.adapters.storage import IMMUTABLE
from photo_publish.keys import original_key, variant_key
from photo_publish.settings import Settings
from tests.template.test_template import Stack, document

PUBLIC_KEY = (
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----\n"
)


def bucket_of(stack: Stack) -> str:
    return str(stack.function("ProcessFunction")["Environment"]["Variables"]["PHOTO_BUCKET"])


def distribution(stack: Stack) -> dict[str, Any]:
    config: dict[str, Any] = stack.properties("VariantDistribution")["DistributionConfig"]
    return config


def outputs(stack: Stack) -> dict[str, Any]:
    """The outputs this stack gives (their conditions hold), values resolved."""
    return {
        name: stack.resolve(output["Value"])
        for name, output in document()["Outputs"].items()
        if "Condition" not in output or stack.condition(output["Condition"])
    }


def cdn_statements(stack: Stack) -> list[dict[str, Any]]:
    policy = stack.properties("PhotoBucketPolicy")["PolicyDocument"]
    return [s for s in policy["Statement"] if s["Effect"] == "Allow"]


def iam_matches(arn: str, pattern: str) -> bool:
    """IAM's resource wildcards: `*` any run of characters (slashes too), `?` one character."""
    return fnmatch.fnmatchcase(arn, pattern)


def test_cloudfront_may_read_the_variants_and_never_an_original() -> None:
    # GIVEN the default stack (the distribution on) and keys of the code's own layout
    stack = Stack()
    bucket = bucket_of(stack)
    album, photo = uuid4(), uuid4()
    variants = [
        variant_key("dev", album, photo, version=version, kind=kind, ext=ext)
        for version in (1, 7)
        for kind in ("thumb", "browse")
        for ext in ("webp", "avif")
    ]
    original = original_key("dev", album, photo, "IMG 0001.jpg")

    # WHEN the bucket policy's Allow statements are read: the distribution's, and no other
    (statement,) = cdn_statements(stack)

    # THEN CloudFront's service may GetObject, nothing else, and only for this stack's distribution
    assert statement["Sid"] == "CdnReadsVariants"
    assert statement["Principal"] == {"Service": "cloudfront.amazonaws.com"}
    assert statement["Action"] == "s3:GetObject"
    assert statement["Condition"] == {
        "StringEquals": {
            "AWS:SourceArn": "arn:aws:cloudfront::123456789012:distribution/<VariantDistribution>"
        }
    }
    # AND its resource pattern takes every variant key and no original, nothing of another stage
    resource = statement["Resource"].replace("<PhotoBucket.Arn>", f"arn:aws:s3:::{bucket}")
    assert resource == f"arn:aws:s3:::{bucket}/dev/albums/*/variants/*"
    for key in variants:
        assert iam_matches(f"arn:aws:s3:::{bucket}/{key}", resource), key
    assert not iam_matches(f"arn:aws:s3:::{bucket}/{original}", resource)
    assert not iam_matches(f"arn:aws:s3:::{bucket}/{original.replace('/originals/', '/')}", resource)
    assert not iam_matches(
        f"arn:aws:s3:::{bucket}/prod/albums/{album}/variants/{photo}/1/thumb.webp", resource
    )
    assert not iam_matches(f"arn:aws:s3:::{bucket}", resource)  # no listing: a missing key is a 403
    # AND the bucket still refuses plain HTTP to everyone, CloudFront included
    policy = stack.properties("PhotoBucketPolicy")["PolicyDocument"]
    assert any(s["Sid"] == "TlsOnly" and s["Effect"] == "Deny" for s in policy["Statement"])


def test_the_distribution_reads_the_bucket_through_origin_access_control_signed_sigv4() -> None:
    stack = Stack()
    (origin,) = distribution(stack)["Origins"]
    assert origin["DomainName"] == f"{bucket_of(stack)}.s3.eu-west-1.amazonaws.com"
    assert origin["OriginAccessControlId"] == "<VariantOriginAccessControl.Id>"
    assert origin["S3OriginConfig"] == {"OriginAccessIdentity": ""}  # no legacy identity
    oac = stack.properties("VariantOriginAccessControl")["OriginAccessControlConfig"]
    assert (oac["OriginAccessControlOriginType"], oac["SigningBehavior"], oac["SigningProtocol"]) == (
        "s3",
        "always",
        "sigv4",
    )
    # an existing bucket is the origin by its name (its owner adds the statement: docs/integrating.md)
    existing = Stack(ExistingBucketName="their-photos")
    (origin,) = distribution(existing)["Origins"]
    assert origin["DomainName"] == "their-photos.s3.eu-west-1.amazonaws.com"
    assert "PhotoBucketPolicy" not in existing.resources()


def test_viewers_reach_it_over_https_only_by_get_and_head() -> None:
    config = distribution(Stack())
    behaviour = config["DefaultCacheBehavior"]
    assert "CacheBehaviors" not in config  # one behaviour for every variant
    assert behaviour["TargetOriginId"] == config["Origins"][0]["Id"]
    assert behaviour["ViewerProtocolPolicy"] == "https-only"
    assert behaviour["AllowedMethods"] == ["GET", "HEAD"]
    assert config["ViewerCertificate"] == {"CloudFrontDefaultCertificate": True}
    # an own host name comes with its certificate and TLS 1.2 at least
    own = distribution(
        Stack(
            CdnDomainName="cdn.example.com",
            CdnCertificateArn="arn:aws:acm:us-east-1:123456789012:certificate/abc",
        )
    )
    assert own["Aliases"] == ["cdn.example.com"]
    assert own["ViewerCertificate"] == {
        "AcmCertificateArn": "arn:aws:acm:us-east-1:123456789012:certificate/abc",
        "SslSupportMethod": "sni-only",
        "MinimumProtocolVersion": "TLSv1.2_2021",
    }


def test_the_cache_keeps_a_variant_as_long_as_its_immutable_cache_control_says() -> None:
    # GIVEN what the process function puts on every variant
    (max_age,) = map(int, re.findall(r"max-age=(\d+)", IMMUTABLE))
    assert "immutable" in IMMUTABLE

    # WHEN the distribution's cache policy is read
    stack = Stack()
    behaviour = distribution(stack)["DefaultCacheBehavior"]
    assert behaviour["CachePolicyId"] == "<VariantCachePolicy>"
    assert "ForwardedValues" not in behaviour  # the legacy settings would override the policy
    config = stack.properties("VariantCachePolicy")["CachePolicyConfig"]

    # THEN the origin's max-age is honoured (between MinTTL and MaxTTL), not cut short
    assert int(config["MinTTL"]) == 0 <= max_age <= int(config["MaxTTL"])
    assert int(config["MaxTTL"]) == max_age
    # AND the key is the path alone: no cookie (signed ones are checked at the edge), header or query
    key = config["ParametersInCacheKeyAndForwardedToOrigin"]
    assert key["CookiesConfig"] == {"CookieBehavior": "none"}
    assert key["HeadersConfig"] == {"HeaderBehavior": "none"}
    assert key["QueryStringsConfig"] == {"QueryStringBehavior": "none"}


def test_every_answer_carries_security_headers_and_cors_only_for_the_apps_origins() -> None:
    stack = Stack()
    assert (
        distribution(stack)["DefaultCacheBehavior"]["ResponseHeadersPolicyId"]
        == "<VariantResponseHeadersPolicy>"
    )
    config = stack.properties("VariantResponseHeadersPolicy")["ResponseHeadersPolicyConfig"]
    security = config["SecurityHeadersConfig"]
    assert int(security["StrictTransportSecurity"]["AccessControlMaxAgeSec"]) >= 31536000
    assert security["ContentTypeOptions"] == {"Override": True}
    assert security["FrameOptions"]["FrameOption"] == "DENY"
    assert "default-src 'none'" in security["ContentSecurityPolicy"]["ContentSecurityPolicy"]
    assert "CorsConfig" not in config
    cors = Stack(AppOrigins="https://app.example.com").properties("VariantResponseHeadersPolicy")[
        "ResponseHeadersPolicyConfig"
    ]["CorsConfig"]
    assert cors["AccessControlAllowOrigins"] == {"Items": ["https://app.example.com"]}
    assert cors["AccessControlAllowMethods"] == {"Items": ["GET", "HEAD"]}


@pytest.mark.parametrize(
    ("parameters", "base_url"),
    [
        ({}, "https://<VariantDistribution.DomainName>"),
        (
            {
                "CdnDomainName": "cdn.example.com",
                "CdnCertificateArn": "arn:aws:acm:us-east-1:123456789012:certificate/abc",
            },
            "https://cdn.example.com",
        ),
    ],
)
def test_the_variant_base_url_is_an_output_and_every_functions_variant_base_url(
    parameters: dict[str, str], base_url: str
) -> None:
    stack = Stack(**parameters)
    assert outputs(stack)["VariantBaseUrl"] == base_url
    for name in stack.functions():
        env = stack.function(name)["Environment"]["Variables"]
        assert env["VARIANT_BASE_URL"] == base_url
        assert Settings.from_env(env).variant_base_url == base_url  # the status answer's URLs


def test_private_albums_make_every_variant_require_the_key_groups_signed_cookies() -> None:
    # GIVEN the default stack: public variants, no key
    public = Stack()
    assert "TrustedKeyGroups" not in distribution(public)["DefaultCacheBehavior"]
    assert not {"VariantPublicKey", "VariantKeyGroup"} & set(public.resources())
    assert "CdnKeyPairId" not in outputs(public)

    # WHEN a public key is given
    private = Stack(CdnPublicKeyPem=PUBLIC_KEY)

    # THEN it is the key group's one key, the behaviour trusts that group, its id is an output
    assert private.properties("VariantPublicKey")["PublicKeyConfig"]["EncodedKey"] == PUBLIC_KEY
    assert private.properties("VariantKeyGroup")["KeyGroupConfig"]["Items"] == ["<VariantPublicKey>"]
    assert distribution(private)["DefaultCacheBehavior"]["TrustedKeyGroups"] == ["<VariantKeyGroup>"]
    assert outputs(private)["CdnKeyPairId"] == "<VariantPublicKey>"
    # AND the signed cookies are not part of the cache key: one cached copy serves every holder
    assert private.properties("VariantCachePolicy") == public.properties("VariantCachePolicy")


@pytest.mark.parametrize("parameters", [{"Cdn": "false"}, {"SamLocal": "true"}])
def test_without_the_cdn_nothing_of_cloudfront_remains(parameters: dict[str, str]) -> None:
    stack = Stack(CdnPublicKeyPem=PUBLIC_KEY, AppOrigins="https://app.example.com", **parameters)
    assert not {n for n, r in stack.resources().items() if r["Type"].startswith("AWS::CloudFront::")}
    assert not cdn_statements(stack)
    assert "cloudfront" not in str(stack.properties("PhotoBucketPolicy"))
    assert not {
        "VariantBaseUrl",
        "VariantDistributionId",
        "VariantDistributionDomainName",
        "CdnKeyPairId",
    } & set(outputs(stack))
    for name in stack.functions():
        assert "VARIANT_BASE_URL" not in stack.function(name)["Environment"]["Variables"]


# The functions that delete photos (the API's DELETE) or send what a deletion left (the sweep).
ERASERS = {"UploadFunction": "UploadRole", "SweepFunction": "SweepRole"}


def invalidation_grants(stack: Stack, role: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in stack.properties(role)["Policies"]
        for statement in policy["PolicyDocument"]["Statement"]
        if "cloudfront" in str(statement["Action"])
    ]


def test_the_functions_that_erase_photos_may_invalidate_the_distribution_and_only_it() -> None:
    # GIVEN the default stack (the distribution on)
    stack = Stack()

    # WHEN the functions' environment and roles are read
    for function, role in ERASERS.items():
        env = stack.function(function)["Environment"]["Variables"]

        # THEN the deleting functions are told the distribution, and may create its invalidations:
        # that action on that distribution, nothing else of CloudFront
        assert env["CDN_DISTRIBUTION_ID"] == "<VariantDistribution>"
        assert Settings.from_env(env).cdn_distribution_id == "<VariantDistribution>"
        (statement,) = invalidation_grants(stack, role)
        assert statement["Action"] == "cloudfront:CreateInvalidation"
        assert statement["Resource"] == "arn:aws:cloudfront::123456789012:distribution/<VariantDistribution>"

    # AND the others neither know of it nor may touch it
    for function in set(stack.functions()) - set(ERASERS):
        assert "CDN_DISTRIBUTION_ID" not in stack.function(function)["Environment"]["Variables"]
    for role in ("ProcessRole", "RelayRole", "MigrateRole"):
        assert not invalidation_grants(stack, role)


@pytest.mark.parametrize("parameters", [{"Cdn": "false"}, {"SamLocal": "true"}])
def test_without_the_cdn_no_function_is_told_of_a_distribution_or_may_invalidate_one(
    parameters: dict[str, str],
) -> None:
    stack = Stack(**parameters)
    for function, role in ERASERS.items():
        if function not in stack.functions():
            continue
        env = stack.function(function)["Environment"]["Variables"]
        assert "CDN_DISTRIBUTION_ID" not in env
        assert Settings.from_env(env | {"DATABASE_URL": "postgresql://x"}).cdn_distribution_id == ""
        assert not invalidation_grants(stack, role)
