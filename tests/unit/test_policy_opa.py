"""OpaEngine's error mapping, over a stub transport (no network): what fails closed, and how."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from sidecar.contract import ErrorCode
from sidecar.errors import MalformedDecisionError, PolicyEvaluationError
from sidecar.policy import Decision, Stage
from sidecar.policy.input import PolicyInput
from sidecar.policy.opa import MAX_ANSWER_BYTES, MAX_ANSWER_DEPTH, OpaEngine
from tests.support.opa_server import deep_json, huge_json

URL = "http://opa.test:8181"
INPUT = PolicyInput.of({"principal": {"id": "u1"}, "tool": {"name": "echo"}})


class StubTransport:
    """Answers every request with ``answer(path, input_json)``: a (status, body) pair, or raises."""

    def __init__(self, answer: Any, *, delay: float = 0.0) -> None:
        self.answer, self.delay = answer, delay
        self.paths: list[str] = []
        self.in_flight = self.most_in_flight = 0
        self.closed = False

    async def evaluate(self, path: str, input_json: str) -> tuple[int, bytes]:
        self.paths.append(path)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return self.answer(path, input_json)  # type: ignore[no-any-return]
        finally:
            self.in_flight -= 1

    async def close_connection(self) -> None:
        self.closed = True


def engine(answer: Any, *, timeout: float = 0.5, delay: float = 0.0) -> tuple[OpaEngine, StubTransport]:
    """An engine over a stub transport, and the stub."""
    stub = StubTransport(answer, delay=delay)
    return OpaEngine(stub, url=URL, timeout_seconds=timeout, revision="opa:test"), stub


def answering(status: int, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda path, input_json: (status, raw)


def raising(exc: BaseException) -> Any:
    def answer(path: str, input_json: str) -> tuple[int, bytes]:
        raise exc

    return answer


async def test_decision_is_the_answers_result_at_the_stages_path() -> None:
    opa, stub = engine(answering(200, {"result": {"allow": False, "code": "RESOURCE_NOT_FOUND", "reason": "r"}}))
    assert await opa.decide(Stage.AUTHZ, INPUT) == Decision(allow=False, code=ErrorCode.RESOURCE_NOT_FOUND, reason="r")
    assert stub.paths == ["toolbooth/authz/decision"]


async def test_input_text_is_passed_as_is() -> None:
    sent: list[str] = []

    def answer(path: str, input_json: str) -> tuple[int, bytes]:
        sent.append(input_json)
        return 200, b'{"result": {"required": false}}'

    await engine(answer)[0].decide(Stage.APPROVAL, INPUT)
    assert sent == [INPUT.json]


@pytest.mark.parametrize(("answer", "message"), [
    pytest.param(answering(200, {}), "undefined", id="undefined"),
    pytest.param(answering(200, {"result": None}), "undefined or null", id="null"),
    pytest.param(answering(200, {"result": {"allow": "yes"}}), r"allow must be a boolean", id="string-allow"),
    pytest.param(answering(200, {"result": [True]}), "a list, not an object", id="array"),
])
async def test_malformed_decisions_are_malformed(answer: Any, message: str) -> None:
    with pytest.raises(MalformedDecisionError, match=rf"data\.toolbooth\.authz\.decision.*{message}"):
        await engine(answer)[0].decide(Stage.AUTHZ, INPUT)


@pytest.mark.parametrize(("answer", "message"), [
    pytest.param(answering(500, {"code": "internal_error", "message": "error(s) occurred while evaluating query",
                                 "errors": [{"code": "eval_conflict_error", "location": {"file": "a.rego", "row": 3},
                                             "message": "complete rules must not produce multiple outputs"}]}),
                 r"HTTP 500 internal_error: error\(s\) occurred while evaluating query; a\.rego:3: "
                 "eval_conflict_error: complete rules must not produce multiple outputs$", id="opa-evaluation-error"),
    pytest.param(answering(503, b"<html>busy</html>"), "HTTP 503$", id="proxy-error-page"),
    pytest.param(answering(401, {"code": "unauthorized", "message": "no"}), "HTTP 401 unauthorized: no",
                 id="unauthorized"),
    pytest.param(answering(200, b"<html>"), "not a JSON object", id="not-json"),
    pytest.param(answering(200, [1]), "not a JSON object", id="json-array"),
    pytest.param(answering(200, huge_json(MAX_ANSWER_BYTES + 1)), f"over {MAX_ANSWER_BYTES} bytes", id="too-large"),
    pytest.param(answering(200, deep_json(MAX_ANSWER_DEPTH + 1)), f"over {MAX_ANSWER_DEPTH} deep", id="too-deep"),
    pytest.param(answering(200, deep_json(100_000)), f"over {MAX_ANSWER_DEPTH} deep", id="past-recursion-limit"),
    pytest.param(answering(500, deep_json(100_000)), "HTTP 500$", id="deep-error-answer"),
    pytest.param(raising(aiohttp.ServerDisconnectedError()), "ServerDisconnectedError", id="dropped"),
    pytest.param(raising(ConnectionRefusedError(111, "Connection refused")), "Connection refused", id="refused"),
    pytest.param(raising(aiohttp.ClientPayloadError("truncated")), "truncated", id="truncated"),
])
async def test_engine_failures_are_evaluation_errors_naming_the_rule_and_request(answer: Any, message: str) -> None:
    with pytest.raises(PolicyEvaluationError, match=message) as caught:
        await engine(answer)[0].decide(Stage.AUTHZ, INPUT)
    assert type(caught.value) is PolicyEvaluationError  # retryable SERVICE_UNAVAILABLE, not a malformed decision
    where = f"data.toolbooth.authz.decision (POST {URL}/v1/data/toolbooth/authz/decision): "
    assert str(caught.value).startswith(where)


async def test_answers_up_to_the_limits_are_decisions() -> None:
    for body in (deep_json(MAX_ANSWER_DEPTH), huge_json(MAX_ANSWER_BYTES)):
        assert (await engine(answering(200, body))[0].decide(Stage.AUTHZ, INPUT)).allow is True


async def test_a_slow_answer_is_an_evaluation_error_within_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(PolicyEvaluationError, match=r"no answer within 0\.05s"):
        await engine(answering(200, {"result": {"allow": True}}), timeout=0.05, delay=5)[0].decide(Stage.AUTHZ, INPUT)
    assert time.monotonic() - started < 0.5


async def test_decide_many_runs_together_and_keeps_order() -> None:
    def answer(path: str, input_json: str) -> tuple[int, bytes]:
        name = json.loads(input_json)["tool"]["name"]
        return 200, json.dumps({"result": {"allow": name.startswith("ok")}}).encode()

    opa, stub = engine(answer, delay=0.01)
    names = ["ok-1", "no-2", "ok-3", "no-4", "ok-5"]
    decisions = await opa.decide_many(Stage.AVAILABILITY, [PolicyInput.of({"tool": {"name": n}}) for n in names])
    assert [d.allow for d in decisions] == [True, False, True, False, True]
    assert stub.most_in_flight == len(names)


async def test_decide_many_fails_when_any_decision_fails() -> None:
    def answer(path: str, input_json: str) -> tuple[int, bytes]:
        if json.loads(input_json)["tool"]["name"] == "bad":
            return 500, b'{"code": "internal_error", "message": "boom"}'
        return 200, b'{"result": {"allow": true}}'

    inputs = [PolicyInput.of({"tool": {"name": n}}) for n in ("good", "bad", "good")]
    with pytest.raises(PolicyEvaluationError, match="boom"):
        await engine(answer)[0].decide_many(Stage.AVAILABILITY, inputs)


async def test_decide_many_of_nothing_asks_nothing() -> None:
    opa, stub = engine(raising(AssertionError("no request expected")))
    assert await opa.decide_many(Stage.AVAILABILITY, []) == []
    assert stub.paths == []


async def test_aclose_closes_the_transport() -> None:
    opa, stub = engine(answering(200, {}))
    await opa.aclose()
    assert stub.closed
