"""An agent loop against a running sidecar, with a scripted model in place of an LLM.

    .venv/bin/pip install -e examples/demo_tools   # index_documents, save_note, send_message
    .venv/bin/toolbooth serve                      # in another terminal
    .venv/bin/python examples/agent_loop.py [TARGET] [--token JWT] [--approver-token JWT]

``TARGET`` defaults to ``$TOOLBOOTH_TARGET``, else the socket ``toolbooth serve`` listens on by default;
``--token`` to ``$TOOLBOOTH_TOKEN`` (none: dev mode); ``--approver-token`` to ``$APPROVER_JWT``. A step whose
tool the sidecar does not offer is skipped, saying so (plain ``toolbooth serve`` offers ``calculate`` only).

The model's replies, each a list of tool calls, and what the loop does with them:

1. three calculations: one reply of several calls is one batch (``execute_batch``) with
   ``cancel_on_permanent_failure``, run one at a time so that the order is plain to see: the division by
   zero fails permanently, and the call after it is cancelled without having run;
2. ``index_documents``: one call is streamed (``execute_stream``): its progress, then its result;
3. ``send_message``: held for approval, with a preview. With an approver's token the loop approves it
   (``approve``, as the approver); without one it says how — in dev mode every caller is the one principal
   ``dev``, and nobody may approve their own call, which the sidecar says when the agent tries;
4. ``send_message`` again, the same call: the loop sends the preview's id as ``approval_id``; approved, the
   call runs, once; still pending, it is held again with the same preview;
5. ``save_note``: a write, whose idempotency key is derived from the model's tool call id;
6. the same tool call again (a retry): the same key, so the stored result comes back, marked replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.client import Client, ClientError, call_request
from sidecar.config import ENV_TARGET, ENV_TOKEN, load_settings
from sidecar.contract import CallRequest, Preview, Progress, Status, ToolDescriptor, ToolResult
from sidecar.integrations.calls import idempotency_key, model_view

APPROVER_TOKEN = "APPROVER_JWT"
MESSAGE = {"to": "board@example.com", "text": "The launch moves to Friday."}
NOTE = {"text": "call the printer company"}


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a model reply: the model's id for it, the tool and the arguments."""

    id: str
    tool: str
    arguments: dict[str, Any]


SCRIPT: list[list[ToolCall]] = [
    [ToolCall("call_1", "calculate", {"operation": "add", "operands": [2, 3]}),
     ToolCall("call_2", "calculate", {"operation": "divide", "operands": [1, 0]}),
     ToolCall("call_3", "calculate", {"operation": "multiply", "operands": [6, 7]})],
    [ToolCall("call_4", "index_documents", {"count": 5})],
    [ToolCall("call_5", "send_message", MESSAGE)],
    [ToolCall("call_6", "send_message", MESSAGE)],
    [ToolCall("call_7", "save_note", NOTE)],
    [ToolCall("call_7", "save_note", NOTE)],
]


class ScriptedModel:
    """Gives the replies of ``SCRIPT`` one by one; keeps what it read back (the results as JSON)."""

    def __init__(self, replies: Sequence[list[ToolCall]]) -> None:
        self._replies = list(replies)
        self.read: list[dict[str, Any]] = []

    def reply(self, results: Sequence[ToolResult]) -> list[ToolCall] | None:
        """The next reply, having read ``results`` (those of the previous one); ``None`` when it is done."""
        self.read += [model_view(result) for result in results]
        return self._replies.pop(0) if self._replies else None


class Loop:
    """Runs each reply's tool calls through the sidecar: several as a batch, one as a stream."""

    def __init__(self, client: Client, approver: Client | None) -> None:
        self.client, self.approver = client, approver
        self.tools: dict[str, ToolDescriptor] = {tool.name: tool for tool in client.list_tools().tools}
        self.pending: dict[str, Preview] = {}  # the preview of each call held for approval, by the call's text

    def run(self, model: ScriptedModel) -> None:
        print(f"tools offered: {', '.join(sorted(self.tools))}")
        results: list[ToolResult] = []
        number = 0
        while (calls := model.reply(results)) is not None:
            number += 1
            offered = [call for call in calls if call.tool in self.tools]
            print(f"\nmodel reply {number}: {', '.join(f'{c.id} {c.tool}' for c in calls)}")
            for call in calls:
                if call.tool not in self.tools:
                    print(f"  {call.id} {call.tool}: skipped, the sidecar offers no such tool "
                          "(pip install -e examples/demo_tools, then restart it)")
            results = self.batch(offered) if len(offered) > 1 else [self.stream(c) for c in offered]
            for call, result in zip(offered, results, strict=True):
                self.show(call, result)
                self.settle(call, result)

    def request(self, call: ToolCall) -> CallRequest:
        """The call as the sidecar takes it: keyed by the model's call id if the tool has side effects, with
        the approval of the same call if one was asked for."""
        keyed = self.tools[call.tool].requires_idempotency_key
        preview = self.pending.get(_text(call))
        return call_request(call.tool, call.arguments, call_id=call.id,
                            idempotency_key=idempotency_key(call.id) if keyed else None,
                            approval_id=preview.preview_id if preview else None)

    def batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        print("  as one batch, one call at a time, cancel_on_permanent_failure")
        return self.client.execute_batch([self.request(call) for call in calls], max_concurrency=1,
                                         cancel_on_permanent_failure=True)

    def stream(self, call: ToolCall) -> ToolResult:
        request = self.request(call)
        for event in self.client.execute_stream(request.tool, request.arguments_json, call_id=request.call_id,
                                                idempotency_key=request.idempotency_key,
                                                approval_id=request.approval_id):
            if isinstance(event, Progress):
                total = "" if event.total is None else f"/{event.total:g}"
                print(f"  {call.id} progress {event.progress:g}{total} {event.message or ''}".rstrip())
            else:
                return event
        raise AssertionError("a stream always ends with its result")

    def show(self, call: ToolCall, result: ToolResult) -> None:
        line = f"  {call.id} {call.tool} -> {result.status}"
        if result.status is Status.SUCCESS:
            line += f" {json.dumps(result.data)}"
            if result.meta.idempotency_replayed:
                line += f" (replayed: the stored result of key {idempotency_key(call.id)})"
        elif result.status is Status.APPROVAL_REQUIRED and result.preview is not None:
            line += f": {result.preview.reason}; preview {result.preview.preview_id}"
        elif result.error is not None:
            error = result.error
            line += f" {error.code} (retryable: {str(error.retryable).lower()}, {error.recovery}): {error.message}"
        print(line)

    def settle(self, call: ToolCall, result: ToolResult) -> None:
        """After a call: ask for the approval of a held call (once), forget the approval of one that ran."""
        if result.status is not Status.APPROVAL_REQUIRED or result.preview is None:
            self.pending.pop(_text(call), None)
            return
        preview = result.preview
        held = self.pending.get(_text(call))
        if held is not None and held.preview_id == preview.preview_id:
            print("    still pending: the same preview")
            return
        self.pending[_text(call)] = preview
        if self.approver is not None:
            answer = self.approver.approve(preview.preview_id, preview.preview_hash, comment="approved by the demo")
            print("    approved by the approver" if answer.ok else f"    not approved: {answer.error}")
            return
        own = self.client.approve(preview.preview_id, preview.preview_hash)
        refusal = f"{own.error.code}: {own.error.message}" if own.error else "approved"
        print(f"    the agent approving its own call: {refusal}")
        print(f'    an approver approves it with: toolbooth approve {preview.preview_id} --token "$APPROVER_JWT"')


def _text(call: ToolCall) -> str:
    return json.dumps([call.tool, call.arguments], sort_keys=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An agent loop with a scripted model against a running sidecar.")
    parser.add_argument("target", nargs="?", default=os.environ.get(ENV_TARGET),
                        help=f"sidecar address (default: ${ENV_TARGET}, else the default socket)")
    parser.add_argument("--token", default=os.environ.get(ENV_TOKEN), help=f"the agent's JWT (default: ${ENV_TOKEN})")
    parser.add_argument("--approver-token", default=os.environ.get(APPROVER_TOKEN),
                        help=f"an approver's JWT (default: ${APPROVER_TOKEN})")
    args = parser.parse_args(argv)
    target = args.target or load_settings(None).server.listen[0]
    print(f"agent loop against {target}")
    approver = Client(target, token=args.approver_token, timeout=30) if args.approver_token else None
    try:
        with Client(target, token=args.token, timeout=30) as client:
            model = ScriptedModel(SCRIPT)
            Loop(client, approver).run(model)
        print(f"\nthe model read {len(model.read)} results, each the typed result as JSON")
    except ClientError as exc:
        print(f"agent_loop: {exc} (is the sidecar running at {target}? start it with `toolbooth serve`)",
              file=sys.stderr)
        return 1
    finally:
        if approver is not None:
            approver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
