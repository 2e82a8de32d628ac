"""CloudFormation's custom resource protocol, for the migrate function (SPEC 11, 17).

CloudFormation sends Create, Update or Delete with a pre-signed S3 URL and waits for a PUT of the
answer there; with no answer a stack hangs for an hour. So every request is answered, whatever
happens: SUCCESS with the work's data, FAILED with the error and where its log is, and FAILED
while there is still time to say so if the work outlives the function's timeout.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

SUCCESS, FAILED = "SUCCESS", "FAILED"
# Kept back from the function's remaining time for the answer itself (its PUT and retries).
ANSWER_SECONDS = 10.0
# CloudFormation refuses a response body over 4,096 bytes: the reason is cut well before.
REASON_CHARACTERS = 2_000
PUT_TRIES = 3


class Context(Protocol):
    """What of Lambda's context object the protocol uses."""

    log_group_name: str
    log_stream_name: str

    def get_remaining_time_in_millis(self) -> int: ...


def is_request(event: Mapping[str, Any]) -> bool:
    """A custom resource request (not a direct invocation such as `aws lambda invoke` with {})."""
    return "RequestType" in event and "ResponseURL" in event


def response(
    event: Mapping[str, Any],
    *,
    status: str,
    physical_id: str,
    reason: str = "",
    data: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body CloudFormation expects at the request's ResponseURL."""
    if status not in (SUCCESS, FAILED):
        raise ValueError(f"a custom resource answers SUCCESS or FAILED, not {status!r}")
    if len(reason) > REASON_CHARACTERS:
        reason = reason[: REASON_CHARACTERS - 1] + "…"
    return {
        "Status": status,
        "Reason": reason,
        "PhysicalResourceId": physical_id,
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
        "NoEcho": False,
        "Data": dict(data or {}),
    }


def put(url: str, body: Mapping[str, Any], *, timeout: float = 5.0) -> None:
    """PUT the answer to the pre-signed URL: an empty Content-Type, as the URL was signed with."""
    payload = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=payload, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(payload))}
    )
    for attempt in range(1, PUT_TRIES + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
            return
        except OSError:
            if attempt == PUT_TRIES:
                raise
            time.sleep(0.5 * attempt)


@dataclass(frozen=True, slots=True)
class Outcome:
    data: Mapping[str, str] | None = None
    error: BaseException | None = None
    finished: bool = True


def within(seconds: float, work: Callable[[], Mapping[str, str]]) -> Outcome:
    """Run `work` for at most `seconds`: its data, its error, or unfinished (it runs on, in a daemon
    thread, until the function's process ends)."""
    result: list[Outcome] = []

    def run() -> None:
        try:
            result.append(Outcome(data=work()))
        except BaseException as error:  # every failure is answered, SystemExit too
            result.append(Outcome(error=error))

    worker = threading.Thread(target=run, name="custom-resource-work", daemon=True)
    worker.start()
    worker.join(max(seconds, 0.0))
    return result[0] if result else Outcome(finished=False)


def handle(
    event: Mapping[str, Any],
    context: Context,
    work: Callable[[], Mapping[str, str]],
    *,
    physical_id: str,
    describe: Callable[[BaseException], str] = str,
    send: Callable[[str, Mapping[str, Any]], None] = put,
    answer_seconds: float = ANSWER_SECONDS,
) -> dict[str, Any]:
    """Answer one request: `work` on Create and Update, nothing on Delete (the data stays).

    The physical id is the same at every run, so that an Update never makes CloudFormation delete
    the "old" resource. `describe` turns an error into the reason CloudFormation shows (the caller
    keeps secrets out of it).
    """
    where = f"log group {context.log_group_name}, stream {context.log_stream_name}"
    if event["RequestType"] == "Delete":
        body = response(
            event,
            status=SUCCESS,
            physical_id=event.get("PhysicalResourceId") or physical_id,
            reason="nothing deleted: the data outlives the stack",
        )
    else:
        budget = context.get_remaining_time_in_millis() / 1000 - answer_seconds
        outcome = within(budget, work)
        if not outcome.finished:
            body = response(
                event,
                status=FAILED,
                physical_id=physical_id,
                reason=f"not finished within {budget:.0f} s, answered before the function's timeout ({where})",
            )
        elif outcome.error is not None:
            body = response(
                event,
                status=FAILED,
                physical_id=physical_id,
                reason=_cut(f"{type(outcome.error).__name__}: {describe(outcome.error)}", where),
            )
        else:
            body = response(event, status=SUCCESS, physical_id=physical_id, data=outcome.data)
    send(event["ResponseURL"], body)
    return body


def _cut(message: str, where: str) -> str:
    """The error, cut to leave room for where its log is (which an operator needs most)."""
    room = REASON_CHARACTERS - len(where) - 3
    if len(message) > room:
        message = message[: room - 1] + "…"
    return f"{message} ({where})"
