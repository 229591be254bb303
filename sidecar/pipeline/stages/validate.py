"""Stage 4, validate: size and nesting limits, then the tool's input model.

Invalid arguments end the call with ``INVALID_ARGUMENT`` (field path, ``correct_arguments``).
Valid ones are kept as the model (for the handler) and as JSON data with secrets in clear (for
policies, hashes and previews), with the pointers of their sensitive values: those the model marks
and those ``data.toolbooth.audit.mask`` lists for the tool.
"""

from __future__ import annotations

from sidecar.config import Limits
from sidecar.contract import ToolResult
from sidecar.pipeline.call import Arguments, Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.decisions import Decider
from sidecar.policy.input import CallInput
from sidecar.tools.masking import reveal
from sidecar.tools.validation import canonical_arguments, parse_arguments

__all__ = ["ValidateStage"]


class ValidateStage:
    """Sets ``call.arguments``, or ends the call with the validation errors."""

    def __init__(self, limits: Limits, decider: Decider) -> None:
        self._limits, self._decider = limits, decider

    async def run(self, call: Call, next: Next) -> ToolResult:
        defn = call.defn
        model = parse_arguments(call.request.arguments_json, defn.input_model,
                                max_bytes=self._limits.max_argument_bytes, max_depth=self._limits.max_argument_depth)
        revealed = reveal(model)
        canonical = canonical_arguments(revealed.data)  # what the input model made of them must still hash
        masked = await self._decider.masked(call, defn.name)
        sensitive = revealed.sensitive.union(masked) if masked else revealed.sensitive
        call.arguments = Arguments(model, revealed.data, sensitive, CallInput.of(revealed.data, call.request),
                                   canonical)
        return await next(call)
