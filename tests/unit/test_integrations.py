"""The framework adapters without a sidecar: the derived key, strict schemas, and the error of a missing extra."""

from __future__ import annotations

import importlib
import sys

import pytest

from sidecar.integrations.calls import idempotency_key
from sidecar.integrations.openai_agents import strict_compatible
from tests.support.tools import Nested, Note, Text


def test_the_key_of_a_tool_call_is_its_id_with_a_prefix() -> None:
    assert idempotency_key("call_abc123") == "toolcall:call_abc123"
    assert idempotency_key("call_abc123") == idempotency_key("call_abc123")


@pytest.mark.parametrize(("schema", "strict"), [
    (Text.model_json_schema(), True),  # closed, every property required
    (Note.model_json_schema(), False),  # not closed: strict mode would refuse what the tool accepts
    (Nested.model_json_schema(), False),  # an open object
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": [], "additionalProperties": False},
     False),  # an optional property
    ({}, False),
], ids=["closed", "open", "open object", "optional property", "empty"])
def test_a_schema_is_strict_only_as_it_is(schema: dict[str, object], strict: bool) -> None:
    before = repr(schema)
    assert strict_compatible(schema) is strict
    assert repr(schema) == before  # the descriptor's schema is not changed by the check


@pytest.mark.parametrize(("module", "framework", "extra"), [
    ("sidecar.integrations.openai_agents", "agents", "openai-agents"),
    ("sidecar.integrations.pydantic_ai", "pydantic_ai", "pydantic-ai"),
])
def test_without_its_framework_an_adapter_names_the_extra_to_install(
        monkeypatch: pytest.MonkeyPatch, module: str, framework: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, framework, None)  # the framework is not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module(module)
    assert str(raised.value).startswith(f"{module} needs ")
    assert str(raised.value).endswith(f"install it with pip install 'toolbooth[{extra}]'")
