"""Agent-framework adapters: each offers the caller's available tools to a framework and calls them through a
running sidecar, with nothing of its own between the model and the gate (``docs/agents.md``).

- ``sidecar.integrations.openai_agents`` — ``FunctionTool``s for the OpenAI Agents SDK (extra ``openai-agents``);
- ``sidecar.integrations.pydantic_ai`` — a PydanticAI toolset (extra ``pydantic-ai``);
- ``sidecar.integrations.calls`` — what both do with one tool call of a model, framework-free: the idempotency
  key derived from the model's tool call id, a remembered approval, the result as the model reads it.

The adapters are a thin layer over ``sidecar.client``: they import nothing of the server side.
"""

from __future__ import annotations

__all__: list[str] = []
