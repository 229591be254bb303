"""The OPA engine: decisions from an OPA server over its REST API, through ``opa-python-client``.

A decision is ``POST /v1/data/toolbooth/<stage>/decision`` with ``{"input": ...}``; the
answer's ``result`` goes through ``parse_decision`` (no ``result``: the rule is
undefined, a malformed decision).

At start the engine either uploads the policy directory — every module to
``PUT /v1/policies/toolbooth/<file>`` (modules it uploaded earlier that are gone are
deleted) and every top-level key of ``data.json`` to ``PUT /v1/data/<key>`` — and
reports the same content-hash revision as the embedded engine for that directory;
or it uses what the server already serves (e.g. bundles managed by OPA) and reports
the revisions of the bundles in ``data.system.bundles`` (``opa-bundles:name@rev,…``),
or ``opa:<url>`` when there are none. Either revision is read once, at start.

Failing closed: no answer within ``timeout_seconds`` (enforced here, whatever the
transport does), a refused or dropped connection, any status but 200 (OPA's own
evaluation errors are HTTP 500 ``internal_error``; decisions ask for
``strict-builtin-errors``, so a failing built-in function is one too, as in the
embedded engine) or a body that is not OPA's answer raise ``PolicyEvaluationError``
naming the rule and the request. Redirects are never followed, by any request (a
decision, an upload, the bundle status): followed, they would send the input to, and
take the answer from, wherever the redirect points; a 3xx is an error like any other
non-200 answer. An answer is read up to ``MAX_ANSWER_BYTES`` and may nest objects and
arrays ``MAX_ANSWER_DEPTH`` deep; a larger or deeper one is an error too (a decision is a
few hundred bytes, three levels deep).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from opa_client import AsyncOpaClient
from opa_client.errors import DeletePolicyError, RegoParseError, TypeException

from sidecar.config import OpaSettings, OpaTlsSettings
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy.decision import AUDIT_MASK_RULE, RULES, Decision, Stage, parse_audit_masks, parse_decision
from sidecar.policy.files import DATA_FILE, PolicyFiles
from sidecar.policy.history import HISTORY_RULE, HistoryNeeds, parse_history_needs
from sidecar.policy.input import IDEMPOTENCY_KEY, PolicyInput
from sidecar.policy.reads import decision_reads

__all__ = ["MAX_ANSWER_BYTES", "MAX_ANSWER_DEPTH", "POLICY_ID_PREFIX", "START_TIMEOUT_SECONDS", "OpaEngine",
           "OpaTransport"]

log = logging.getLogger("toolbooth.policy.opa")

POLICY_ID_PREFIX = "toolbooth/"
START_TIMEOUT_SECONDS = 10.0  # each request made at start; decisions have their own timeout
MAX_ANSWER_BYTES = 1 << 20  # 1 MiB: a decision is a few hundred bytes; audit masks, bundle manifests a few KiB
MAX_ANSWER_DEPTH = 32  # nested objects and arrays: a decision answer is 3 deep, the bundle status 4 or 5
_JSON = {"Content-Type": "application/json"}


class _Redirected(aiohttp.ClientError):
    """OPA answered a redirect, which is not followed."""


_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError)
# What a start-up request's answer that is not OPA's makes the client library raise (it reads it unchecked).
_NOT_OPAS_ANSWER = (ValueError, RecursionError, LookupError, AttributeError, TypeError)


class OpaTransport(Protocol):
    """What a decision needs from the HTTP client (the seam unit tests replace)."""

    async def evaluate(self, path: str, input_json: str) -> tuple[int, bytes]:
        """``POST /v1/data/<path>`` with ``input_json`` as the input: status and body (at least
        ``MAX_ANSWER_BYTES + 1`` bytes of it, if it is longer); never follows a redirect."""
        ...

    async def close_connection(self) -> None:
        """Release the HTTP session."""
        ...


class OpaEngine:
    """``PolicyEngine`` asking an OPA server for ``data.toolbooth.<stage>.decision``."""

    def __init__(self, transport: OpaTransport, *, url: str, timeout_seconds: float, revision: str,
                 reads_idempotency_key: bool = True, mentions: Callable[[str], bool] | None = None,
                 reads: Mapping[Stage, frozenset[str]] | None = None) -> None:
        self._transport, self._url, self._timeout, self._revision = transport, url, timeout_seconds, revision
        self._reads_key = reads_idempotency_key
        self._mentions, self._reads = mentions or _mentioned, reads

    @classmethod
    async def open(cls, settings: OpaSettings, files: PolicyFiles | None) -> OpaEngine:
        """Connect; upload ``files``, or (``None``) use the policies OPA manages itself; raise ``PolicyLoadError``."""
        client = await _Client.connect(settings)
        try:
            revision = await (_served_revision(client, settings.url) if files is None
                              else _upload(client, files, settings.url))
        except BaseException:
            await client.close_connection()
            raise
        return cls(client, url=settings.url, timeout_seconds=settings.timeout_seconds, revision=revision,
                   reads_idempotency_key=files is None or files.mentions(IDEMPOTENCY_KEY),
                   mentions=None if files is None else files.mentions,
                   reads=None if files is None else decision_reads(files.modules))

    @property
    def revision(self) -> str:
        """The uploaded files' content hash, the served bundles' revisions, or ``opa:<url>``."""
        return self._revision

    @property
    def reads_idempotency_key(self) -> bool:
        """Whether the uploaded policies mention ``idempotency_key``; true for policies OPA manages itself
        (``upload_policies: false``): what they read is not known here."""
        return self._reads_key

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """Evaluate one decision, within the timeout."""
        return parse_decision(stage, await self._ask(RULES[stage], input.json))

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        """``data.toolbooth.audit.mask`` as OPA serves it, checked."""
        return parse_audit_masks(await self._ask(AUDIT_MASK_RULE, "{}"))

    async def history_needs(self) -> HistoryNeeds:
        """``data.toolbooth.history`` as OPA serves it, checked; labels and failures are read where the uploaded
        policies mention them, and always for policies OPA manages itself (what they read is not known here: each
        decision gets all of it)."""
        return parse_history_needs(await self._ask(HISTORY_RULE, "{}"), self._mentions, self._reads)

    async def _ask(self, rule: str, input_json: str) -> Any:
        """The value of ``rule`` for ``input_json``, within the timeout."""
        path = rule.removeprefix("data.").replace(".", "/")
        where = f"{rule} (POST {self._url}/v1/data/{path})"
        try:
            async with asyncio.timeout(self._timeout):
                status, body = await self._transport.evaluate(path, input_json)
        except TimeoutError as exc:
            raise PolicyEvaluationError(f"{where}: no answer within {self._timeout:g}s") from exc
        except _TRANSPORT_ERRORS as exc:
            raise PolicyEvaluationError(f"{where}: {_problem(exc)}") from exc
        return _result(where, status, body)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """One request per input, all in flight together (so one timeout bounds them); in order."""
        outcomes = await asyncio.gather(*(self.decide(stage, item) for item in inputs), return_exceptions=True)
        if failed := next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None):
            raise failed
        return [outcome for outcome in outcomes if isinstance(outcome, Decision)]

    async def aclose(self) -> None:
        """Close the HTTP session."""
        await self._transport.close_connection()


def _mentioned(word: str) -> bool:
    """What policies OPA manages itself may mention: anything."""
    return True


def _result(where: str, status: int, body: bytes) -> Any:
    """The ``result`` of an answer (``None`` when undefined); an error answer raises ``PolicyEvaluationError``."""
    answer, problem = _decode(body)
    if status != 200:
        error = answer if isinstance(answer, dict) else {}
        detail = f" {error.get('code')}: {error.get('message')}" if "code" in error else ""
        raise PolicyEvaluationError(f"{where}: OPA answered HTTP {status}{detail}{_listed(error.get('errors'))}")
    if problem is not None:
        raise PolicyEvaluationError(f"{where}: {problem}")
    if not isinstance(answer, dict):
        raise PolicyEvaluationError(f"{where}: the answer is not a JSON object: {body[:80]!r}")
    return answer.get("result")


def _listed(errors: Any) -> str:
    """The errors OPA lists in an error answer (an evaluation error's code, place and message), as text."""
    if not isinstance(errors, list):
        return ""
    found = [error for error in errors if isinstance(error, dict)]
    return "".join(f"; {_place(error.get('location'))}{error.get('code')}: {error.get('message')}" for error in found)


def _place(location: Any) -> str:
    """``file:row: `` of an OPA error's location, or nothing."""
    return f"{location.get('file')}:{location.get('row')}: " if isinstance(location, dict) else ""


def _decode(body: bytes) -> tuple[Any, str | None]:
    """The answer's JSON, or what is wrong with it: over ``MAX_ANSWER_BYTES`` or ``MAX_ANSWER_DEPTH``."""
    if len(body) > MAX_ANSWER_BYTES:
        return None, f"the answer is over {MAX_ANSWER_BYTES} bytes"
    too_deep = f"the answer nests objects and arrays over {MAX_ANSWER_DEPTH} deep"
    try:
        answer = json.loads(body)
    except RecursionError:  # deeper than the interpreter's recursion limit: the decoder gives up
        return None, too_deep
    except ValueError:
        return None, None
    # Each level opens a bracket: with few of them (any real answer), the answer cannot be too deep.
    if body.count(b"[") + body.count(b"{") > MAX_ANSWER_DEPTH and _deeper_than(answer, MAX_ANSWER_DEPTH):
        return None, too_deep
    return answer, None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` deep (level by level: no recursion)."""
    level, depth = [value], 0
    while level := [item for item in level if isinstance(item, dict | list)]:
        depth += 1
        if depth > limit:
            return True
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else item)]
    return False


def _problem(exc: BaseException) -> str:
    """A transport error as text: a refused redirect says so itself, other errors are named."""
    return str(exc) if isinstance(exc, _Redirected) else f"{type(exc).__name__}: {exc}"


class _Client(AsyncOpaClient):
    """``AsyncOpaClient`` with the configured TLS, without retries, sending input JSON as is."""

    def __init__(self, settings: OpaSettings) -> None:
        parts = urlsplit(settings.url)
        host, https = parts.hostname or "", parts.scheme == "https"
        super().__init__(host=f"[{host}]" if ":" in host else host, port=parts.port or (443 if https else 80),
                         ssl=https, token=settings.token.get_secret_value() if settings.token else None,
                         retries=0, timeout=START_TIMEOUT_SECONDS)
        self._tls = _ssl_context(settings.tls) if https else None

    @classmethod
    async def connect(cls, settings: OpaSettings) -> _Client:
        """A client with its HTTP session open."""
        client = cls(settings)
        await client._init_session()
        return client

    async def _init_session(self) -> None:
        """The base class's session, but with our TLS context (the base one cannot take a CA file)."""
        self._connector = aiohttp.TCPConnector(ssl=self._tls if self._tls is not None else True)
        self._session = aiohttp.ClientSession(headers=self.headers, connector=self._connector,
                                              timeout=aiohttp.ClientTimeout(total=self.timeout))

    @asynccontextmanager
    async def _request(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """The base class's request, never following a redirect: a 3xx answer raises ``_Redirected``."""
        async with super()._request(method, url, allow_redirects=False, **kwargs) as response:
            if 300 <= response.status < 400:
                raise _Redirected(f"OPA answered HTTP {response.status} (to {response.headers.get('Location')!r}), "
                                  "and redirects are not followed")
            yield response

    async def evaluate(self, path: str, input_json: str) -> tuple[int, bytes]:
        """``POST /v1/data/<path>``: status and raw body, read up to ``MAX_ANSWER_BYTES + 1`` bytes.

        Unlike ``query_rule``, the input text is sent as it is (not decoded and encoded
        again), and an error answer's body, which carries OPA's code and message, is kept.
        A built-in function's error is an evaluation error, as in the embedded engine,
        not an undefined value (OPA's default). Of a longer body the rest is never read
        (the connection is then closed, not reused).
        """
        body = f'{{"input":{input_json}}}'.encode()
        url = f"{self.root_url}/data/{path}?strict-builtin-errors=true"
        async with self._request("POST", url, data=body, headers=_JSON) as response:
            return response.status, await _read_at_most(response.content, MAX_ANSWER_BYTES + 1)


async def _read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The stream's bytes until its end or ``limit`` bytes, whichever comes first."""
    chunks, size = [], 0
    while size < limit and (chunk := await content.read(limit - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _ssl_context(tls: OpaTlsSettings | None) -> ssl.SSLContext:
    """Verify the server (against ``ca_file`` only, when given); present the client certificate, if any."""
    tls = tls or OpaTlsSettings()
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise PolicyLoadError(f"policy.opa.tls.ca_file: cannot load {tls.ca_file}: {exc}") from None
    if tls.cert_file is not None:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise PolicyLoadError(f"policy.opa.tls.cert_file: cannot load the client certificate: {exc}") from None
    return context


async def _upload(client: _Client, files: PolicyFiles, url: str) -> str:
    """Make the server hold exactly ``files`` under our policy ids, and their data; the files' revision."""
    ids = [POLICY_ID_PREFIX + name for name, _ in files.modules]
    async with _starting(f"upload policies to OPA at {url}"):
        for stale in [found for found in await client.get_policies_list()
                      if found.startswith(POLICY_ID_PREFIX) and found not in ids]:
            await client.delete_policy(stale)
        for policy_id, (name, text) in zip(ids, files.modules, strict=True):
            await _put(files.root / name, client.update_policy_from_string(text, policy_id, rego_compat=False))
        for key, value in _data_documents(files):
            await _put(files.root / DATA_FILE, client.update_or_create_data(value, key))
    return files.revision()


async def _put(file: Path, upload: Awaitable[object]) -> None:
    """Await one upload; OPA refusing it is a ``PolicyLoadError`` naming ``file``."""
    try:
        await upload
    except (RegoParseError, TypeException) as exc:
        raise PolicyLoadError(f"cannot load {file}: OPA refused it: {_describe(exc)}") from None


def _data_documents(files: PolicyFiles) -> list[tuple[str, dict[str, Any]]]:
    """``data.json``'s top-level keys and values: each is written to ``/v1/data/<key>``."""
    if files.data is None:
        return []
    try:
        data = json.loads(files.data)
    except ValueError as exc:
        raise PolicyLoadError(f"cannot load {files.root / DATA_FILE}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(value, dict) for value in data.values()):
        raise PolicyLoadError(f"cannot load {files.root / DATA_FILE}: to upload it to OPA, it must be an object "
                              "whose values are objects")
    return list(data.items())


async def _served_revision(client: _Client, url: str) -> str:
    """``opa-bundles:name@revision,…`` of the bundles the server has activated, else ``opa:<url>``."""
    try:
        status, body = await client.evaluate("system/bundles", "{}")
        bundles = _result("data.system.bundles", status, body)
    except (PolicyEvaluationError, *_TRANSPORT_ERRORS) as exc:
        log.warning("cannot read the bundle revisions of OPA at %s (%s): the policy revision is reported as "
                    "opa:%s", url, exc, url)
        bundles = None
    if not isinstance(bundles, dict) or not bundles:
        return f"opa:{url}"
    return "opa-bundles:" + ",".join(f"{name}@{_manifest_revision(bundle)}" for name, bundle in sorted(bundles.items()))


def _manifest_revision(bundle: Any) -> str:
    manifest = bundle.get("manifest") if isinstance(bundle, dict) else None
    return str(manifest.get("revision", "")) if isinstance(manifest, dict) else ""


@asynccontextmanager
async def _starting(doing: str) -> AsyncIterator[None]:
    """Turn what can go wrong talking to OPA at start into ``PolicyLoadError``."""
    try:
        yield
    except PolicyLoadError:
        raise
    except DeletePolicyError as exc:
        raise PolicyLoadError(f"cannot {doing}: {_describe(exc)}") from None
    except _TRANSPORT_ERRORS as exc:
        raise PolicyLoadError(f"cannot {doing}: {_problem(exc)}") from None
    except _NOT_OPAS_ANSWER as exc:
        raise PolicyLoadError(f"cannot {doing}: the answer is not OPA's ({type(exc).__name__}: {exc})") from None


def _describe(exc: DeletePolicyError | RegoParseError | TypeException) -> str:
    """An ``opa_client`` error: OPA's code and message, then each compile error at its row:col."""
    message = "" if isinstance(exc, TypeException) else exc.message  # a TypeException has no message
    parts = [": ".join(str(part) for part in (exc.expression, message) if part)]
    for error in exc.errors if isinstance(exc, RegoParseError) else []:
        location = error.get("location") or {}
        parts.append(f"{location.get('row', '?')}:{location.get('col', '?')}: {error.get('message')}")
    return "; ".join(parts)
