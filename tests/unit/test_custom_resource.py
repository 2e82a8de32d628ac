"""CloudFormation's custom resource protocol (photo_publish.deploy): every request is answered,
with the body CloudFormation reads, also when the work fails or outlives the function."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from photo_publish import deploy
from tests.cfn_responses import response_url

EVENT = {
    "RequestType": "Create",
    "ServiceToken": "arn:aws:lambda:eu-west-1:123456789012:function:photo-publish-dev-migrate",
    "ResponseURL": "http://127.0.0.1:9/unused",
    "StackId": "arn:aws:cloudformation:eu-west-1:123456789012:stack/photo-publish-dev/8c6a-11ef",
    "RequestId": "d3b4a5c6-0001",
    "LogicalResourceId": "Migrations",
    "ResourceType": "Custom::Migrations",
    "ResourceProperties": {"ServiceToken": "arn:...", "Head": "0010", "Stage": "dev"},
}


@dataclass
class Context:
    remaining_ms: int = 60_000
    log_group_name: str = "/aws/lambda/photo-publish-dev-migrate"
    log_stream_name: str = "2026/12/03/[$LATEST]abc123"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


class Sent(list[tuple[str, Mapping[str, Any]]]):
    def __call__(self, url: str, body: Mapping[str, Any]) -> None:
        self.append((url, body))


def request(kind: str, **extra: Any) -> dict[str, Any]:
    return EVENT | {"RequestType": kind} | extra


@pytest.mark.parametrize("kind", ["Create", "Update"])
def test_create_and_update_run_the_work_and_answer_success_with_its_data(kind: str) -> None:
    # GIVEN a request and work that succeeds
    sent = Sent()
    # WHEN it is handled
    body = deploy.handle(
        request(kind), Context(), lambda: {"Revision": "0010"}, physical_id="pp-dev", send=sent
    )
    # THEN CloudFormation's body, sent to the request's URL
    assert sent == [(EVENT["ResponseURL"], body)]
    assert body == {
        "Status": "SUCCESS",
        "Reason": "",
        "PhysicalResourceId": "pp-dev",
        "StackId": EVENT["StackId"],
        "RequestId": EVENT["RequestId"],
        "LogicalResourceId": "Migrations",
        "NoEcho": False,
        "Data": {"Revision": "0010"},
    }


def test_delete_does_nothing_and_succeeds_with_the_resources_own_id() -> None:
    ran, sent = [], Sent()
    body = deploy.handle(
        request("Delete", PhysicalResourceId="pp-dev-old"),
        Context(),
        lambda: ran.append(1) or {},
        physical_id="pp-dev",
        send=sent,
    )
    assert ran == []  # never drops data
    assert (body["Status"], body["PhysicalResourceId"]) == ("SUCCESS", "pp-dev-old")
    assert len(sent) == 1


def test_a_failure_is_answered_failed_with_the_error_and_the_log_stream() -> None:
    def work() -> dict[str, str]:
        raise ConnectionError("connection to server at 10.0.0.5 refused")

    sent = Sent()
    body = deploy.handle(request("Update"), Context(), work, physical_id="pp-dev", send=sent)
    assert body["Status"] == "FAILED"
    assert body["PhysicalResourceId"] == "pp-dev"  # the same: a failed update deletes nothing
    assert "ConnectionError: connection to server at 10.0.0.5 refused" in body["Reason"]
    assert Context.log_stream_name in body["Reason"] and Context.log_group_name in body["Reason"]
    assert body["Data"] == {}
    assert sent == [(EVENT["ResponseURL"], body)]


def test_the_reason_is_described_by_the_caller_and_cut_to_fit_keeping_the_log_stream() -> None:
    def work() -> dict[str, str]:
        raise RuntimeError("x" * 10_000)

    body = deploy.handle(
        request("Create"), Context(), work, physical_id="p", send=Sent(), describe=lambda e: f"said: {e}"
    )
    assert body["Reason"].startswith("RuntimeError: said: xxx")
    assert body["Reason"].endswith(f"stream {Context.log_stream_name})")
    assert len(json.dumps(body).encode()) < 4096  # CloudFormation's limit for a response


def test_work_that_outlives_the_time_left_is_answered_failed_before_the_timeout() -> None:
    # GIVEN 10.5 s left, of which 10 are kept for the answer, and work that would take longer
    release = threading.Event()
    started = time.monotonic()
    try:
        body = deploy.handle(
            request("Create"),
            Context(remaining_ms=10_500),
            lambda: release.wait(30) and {},  # type: ignore[func-returns-value]
            physical_id="p",
            send=Sent(),
        )
    finally:
        release.set()
    # THEN FAILED within the half second it had
    assert time.monotonic() - started < 2
    assert body["Status"] == "FAILED" and "not finished within" in body["Reason"]


def test_a_direct_invocation_is_not_a_custom_resource_request() -> None:
    assert deploy.is_request(EVENT)
    assert not deploy.is_request({})
    assert not deploy.is_request({"RequestType": "Create"})  # no URL to answer


def test_the_answer_is_a_put_of_the_json_with_an_empty_content_type() -> None:
    # GIVEN a pre-signed-style URL on a local server that fails once
    with response_url() as server:
        server.failures_left = 1
        body = deploy.response(EVENT, status=deploy.SUCCESS, physical_id="p", data={"Revision": "0010"})
        # WHEN it is sent
        deploy.put(server.url(), body)
    # THEN one PUT arrived (after a retry), as S3's signature expects it: no content type
    (put,) = server.puts
    assert put.path == server.url().removeprefix(server.base)
    assert put.headers.get("Content-Type") == ""
    assert put.body == body


def test_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="SUCCESS or FAILED"):
        deploy.response(EVENT, status="OK", physical_id="p")
