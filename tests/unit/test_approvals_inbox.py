"""The approval inbox's parts on their own: its config section, sessions, the Host check and how previews read."""

from __future__ import annotations

import importlib.util
import json

import pytest

from sidecar.config import parse_settings
from sidecar.config.endpoints import check_installed
from sidecar.contract import Preview, PreviewState, Principal
from sidecar.errors import ConfigError
from sidecar.server.approvals_ui.live import version_of
from sidecar.server.approvals_ui.outcomes import CallRuns
from sidecar.server.approvals_ui.places import to_end
from sidecar.server.approvals_ui.sessions import Sessions, SessionsFull, SignedIn, csrf_matches
from sidecar.server.approvals_ui.views import Item, PreviewView, items
from sidecar.server.http_hosts import is_loopback_host
from sidecar.state import AuditEvent, AuditRecord

BOB = Principal(id="bob", tenant="acme", roles=("approver",))
DAVE = Principal(id="dave", tenant="acme", roles=("approver",))
JWT = {"algorithms": ["HS256"], "issuer": "i", "audience": "a", "key": "k" * 32}


def test_the_inbox_is_off_by_default_and_listens_on_one_tcp_address() -> None:
    assert parse_settings({}).approvals_ui.listen is None and parse_settings({}).approvals_ui.endpoint is None
    endpoint = parse_settings({"approvals_ui": {"listen": "[::1]:8780"}}).approvals_ui.endpoint
    assert endpoint is not None and (endpoint.host, endpoint.port, endpoint.is_loopback) == ("[::1]", 8780, True)
    with pytest.raises(ConfigError, match=r"config error at approvals_ui\.listen: 'unix:///x\.sock': the approval "
                                          r"inbox listens on one TCP address, HOST:PORT or \[IPV6\]:PORT"):
        parse_settings({"approvals_ui": {"listen": "unix:///x.sock"}})
    with pytest.raises(ConfigError, match=r"config error at approvals_ui\.listen: 'ipv4:127\.0\.0\.1:1,"
                                          r"127\.0\.0\.1:2': the approval inbox listens on one TCP address"):
        parse_settings({"approvals_ui": {"listen": "ipv4:127.0.0.1:1,127.0.0.1:2"}})


@pytest.mark.parametrize(("key", "value", "message"), [
    ("session_seconds", 0, "Input should be greater than 0"),
    ("page_size", 500, "Input should be less than or equal to 200"),
    ("live_seconds", 0, "Input should be greater than or equal to 0.2"),
    ("live_seconds", 61, "Input should be less than or equal to 60"),
    ("live_seconds", "often", "Input should be a valid number"),
    ("max_sessions", 0, "Input should be greater than 0"),
    ("max_sessions_per_principal", 0, "Input should be greater than 0"),
    ("max_streams_per_principal", 0, "Input should be greater than 0"),
    ("max_streams", 0, "Input should be greater than 0"),
    ("approver_roles", [], "Tuple should have at least 1 item"),
    ("approver_roles", [""], "a role name may not be empty"),
    ("theme", "dark", "unknown key"),
])
def test_bad_inbox_settings_name_the_key(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"config error at approvals_ui\.{key}: {message}"):
        parse_settings({"approvals_ui": {key: value}})


@pytest.mark.parametrize(("ui", "message"), [
    ({"max_streams": 65}, r"max_streams \(65\) may be at most half of http\.max_connections \(128\): the rest is "
                          r"kept for page loads and sign-ins"),
    ({"max_streams_per_principal": 33}, r"max_streams_per_principal \(33\) may be at most a quarter of "
                                        r"http\.max_connections \(128\), so that a few principals cannot fill"),
    ({"http": {"max_connections": 8}}, r"max_streams_per_principal \(4\) may be at most a quarter of "
                                       r"http\.max_connections \(8\)"),
    ({"max_streams": 2, "max_streams_per_principal": 3}, r"max_streams_per_principal \(3\) may not exceed "
                                                         r"max_streams \(2\)"),
])
def test_live_streams_may_not_fill_the_inbox_listener(ui: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config error at approvals_ui: {message}"):
        parse_settings({"approvals_ui": ui})
    defaults = parse_settings({}).approvals_ui
    assert (defaults.max_streams_per_principal, defaults.max_streams, defaults.stream_cap) == (4, None, 64)
    assert parse_settings({"approvals_ui": {"http": {"max_connections": 40}}}).approvals_ui.stream_cap == 20


def test_one_principals_sessions_fit_within_everyones() -> None:
    with pytest.raises(ConfigError, match=r"config error at approvals_ui: max_sessions_per_principal \(20\) may not "
                                          r"exceed max_sessions \(5\)"):
        parse_settings({"approvals_ui": {"max_sessions": 5, "max_sessions_per_principal": 20}})
    ui = parse_settings({}).approvals_ui
    assert (ui.max_sessions, ui.max_sessions_per_principal, ui.approver_roles) == (10_000, 10, ("approver",))


def test_dev_mode_refuses_an_inbox_on_a_public_address() -> None:
    with pytest.raises(ConfigError, match=r"approvals_ui\.listen: '0\.0\.0\.0:8780' is not a loopback address; "
                                          r"auth mode 'dev' trusts a static principal"):
        parse_settings({"approvals_ui": {"listen": "0.0.0.0:8780"}})
    settings = parse_settings({"approvals_ui": {"listen": "0.0.0.0:8780"}, "auth": {"jwt": JWT}})
    assert settings.approvals_ui.endpoint is not None and not settings.approvals_ui.endpoint.is_loopback


def test_serving_the_inbox_without_its_web_stack_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jinja2" else real(name, *a))
    settings = parse_settings({"approvals_ui": {"listen": "127.0.0.1:8780"}})
    with pytest.raises(ConfigError, match=r"config error at approvals_ui\.listen: serving the approval inbox needs "
                                          r"the 'approvals-ui' extra \(pip install 'toolbooth\[approvals-ui\]'\); "
                                          r"missing: jinja2"):
        check_installed(settings)
    check_installed(parse_settings({}))  # off: nothing to need


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_with_its_token_or_after_the_longest_session() -> None:
    clock = Clock()
    sessions = Sessions(60, max_open=10, per_principal=10, clock=clock)
    short = sessions.open(SignedIn(BOB, "token", until=1010.0))
    long = sessions.open(SignedIn(BOB, "token", until=5000.0))
    dev = sessions.open(SignedIn(BOB, "dev"))
    assert (short.expires_at, long.expires_at, dev.expires_at) == (1010.0, 1060.0, 1060.0)
    assert len({short.id, long.id, dev.id}) == 3 and short.csrf != long.csrf and len(short.id) >= 43
    assert sessions.get(short.id) == short and sessions.seconds_left(short) == 10
    clock.now = 1010.0
    assert sessions.get(short.id) is None and sessions.get(long.id) == long
    sessions.close(long.id)
    assert sessions.get(long.id) is None and sessions.get(None) is None and sessions.get("guess") is None


def test_past_ones_most_sessions_ones_own_oldest_is_ended() -> None:
    sessions = Sessions(60, max_open=10, per_principal=2, clock=Clock())
    first = sessions.open(SignedIn(BOB, "token", until=1030.0))
    second = sessions.open(SignedIn(BOB, "token", until=1010.0))
    third = sessions.open(SignedIn(BOB, "token", until=1020.0))
    assert sessions.get(first.id) is None and sessions.get(second.id) == second and sessions.get(third.id) == third


def test_a_full_inbox_refuses_a_newcomer_and_ends_nobody_elses_session() -> None:
    sessions = Sessions(60, max_open=2, per_principal=2, clock=Clock())
    bob = sessions.open(SignedIn(BOB, "token", until=1001.0))  # would end first: still never taken
    dave = sessions.open(SignedIn(DAVE, "token"))
    with pytest.raises(SessionsFull, match=r"the inbox holds its most sessions \(2, approvals_ui\.max_sessions\)"):
        sessions.open(SignedIn(Principal(id="bob", tenant="other", roles=("approver",)), "token"))
    again = sessions.open(SignedIn(DAVE, "dev"))  # one who holds a session gives up their own oldest
    assert sessions.get(bob.id) == bob and sessions.get(dave.id) is None and sessions.get(again.id) == again


def test_a_newcomer_ends_only_their_own_oldest_places_and_is_refused_when_all_are_others() -> None:
    assert to_end([], 3, per_principal=2, max_open=3) is None
    assert to_end([], 2, per_principal=2, max_open=3) == []
    assert to_end(["a"], 2, per_principal=2, max_open=3) == []
    assert to_end(["a", "b"], 2, per_principal=2, max_open=3) == ["a"]  # their own cap
    assert to_end(["a", "b"], 5, per_principal=4, max_open=4) == ["a", "b"]  # everyone's cap, theirs first only
    assert to_end(["a", "b", "c"], 3, per_principal=2, max_open=9) == ["a", "b"]  # a lowered cap


def test_a_principal_is_one_whatever_their_roles() -> None:
    assert BOB.identity == Principal(id="bob", tenant=BOB.tenant).identity == (BOB.tenant, "bob")
    assert Principal(id="bob", tenant="other").identity != BOB.identity


def test_csrf_tokens_must_match_exactly() -> None:
    assert csrf_matches("abc", "abc")
    assert not csrf_matches("abc", None) and not csrf_matches("abc", "") and not csrf_matches("abc", "abd")
    assert not csrf_matches("abc", "ábc")


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:8780", True), ("localhost:1", True), ("[::1]:8780", True), ("[::1]", True), ("localhost", True),
    ("evil.example:8780", False), ("127.0.0.1.evil.example", False), ("", False), (":80", False),
])
def test_the_host_header_of_a_loopback_inbox(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_an_email_rendering_reads_headline_first_with_its_body_as_written() -> None:
    shown = items({"body": "Hello,\nthe release is out.", "cc": [], "subject": "Release",
                   "to": ["a@x.test", "b@x.test"],
                   "warnings": [{"code": "EXTERNAL", "message": "outside the organization"}]})
    assert shown == (Item("Subject", "Release"), Item("To", "a@x.test, b@x.test"),
                     Item("Cc", "none"), Item("Body", "Hello,\nthe release is out.", block=True),
                     Item("Warnings", "EXTERNAL · outside the organization"))


def test_a_task_rendering_nests_its_task_and_shows_small_objects_on_one_line() -> None:
    [task] = items({"task": {"title": "Write notes", "project": {"id": "p-1", "name": "Website"},
                             "assignee": None, "due_at": "2026-12-02T17:00:00Z", "priority": "high"}})
    assert task.label == "Task" and task.children == (
        Item("Title", "Write notes"), Item("Project", "Website · p-1"), Item("Assignee", "none"),
        Item("Due", "2026-12-02T17:00:00Z"), Item("Priority", "high"))


def test_masked_values_are_marked_and_shown_masked() -> None:
    masked = "hmac-sha256:" + "0" * 64
    assert items({"token": masked, "keys": [masked]}) == (
        Item("Keys", masked, masked=True), Item("Token", masked, masked=True))
    assert items("plain") == (Item("Value", "plain"),)
    assert items({"n": 3, "ok": True, "deep": [{"a": [1, 2]}]}) == (
        Item("Deep", children=(Item("1", children=(Item("A", "1, 2"),)),)), Item("N", "3"), Item("Ok", "yes"))


def test_a_preview_reads_who_asked_where_and_until_when() -> None:
    call = {"tool": "file_note", "version": "1.0.0", "arguments": {"title": "t"}, "conversation_id": "c-1",
            "principal": {"id": "alice", "tenant": "acme"}, "policy_revision": "r"}
    preview = Preview(preview_id="p", preview_hash="sha256:x", call_json=json.dumps(call), reason="why",
                      expires_at="2026-12-01T10:15:00Z", created_at="2026-12-01T10:00:00Z")
    view = PreviewView.of(preview)
    assert (view.tool, view.requester, view.requester_id, view.conversation, view.rendered) == (
        "file_note", "alice (acme)", "alice", "c-1", False)
    assert view.shown == (Item("Title", "t"),)
    now = view.created_at
    assert now is not None and view.age(now) == "under a minute" and view.expires_in(now) == "15 min"
    assert view.expires_in(view.expires_at) == "expired"
    assert view.status(now) == "pending" and view.status(view.expires_at) == "expired"
    used = PreviewView.of(preview.model_copy(update={"state": PreviewState.USED}))
    assert used.status(view.expires_at) == "used"  # decided: what it became, expired or not


def test_a_preview_changed_into_unreadable_json_reads_as_unreadable() -> None:
    preview = Preview(preview_id="p", preview_hash="sha256:x", call_json="{not json", reason="why",
                      expires_at="2026-12-01T10:15:00Z", rendering_json="[1]")
    view = PreviewView.of(preview)
    assert (view.tool, view.requester, view.created_at) == ("", "?", None)
    assert view.rendered and view.shown == (Item("Unreadable", "this stored preview is not readable (it was changed in "
                                                               "the store); it cannot be approved"),)
    assert PreviewView.of(preview.model_copy(update={"rendering_json": None})).shown == view.shown


def step(request_id: str, status: str, error_code: str | None = None, second: int = 0) -> AuditRecord:
    event = AuditEvent(request_id=request_id, time=f"2026-12-01T10:00:{second:02d}.000+00:00", principal_id="alice",
                       tenant="acme", tool="file_note", tool_version="1.0.0", input_hash="sha256:x",
                       decisions_json='{"approval_id": "p"}', policy_revision="r", idempotency_key="k", call_id=None,
                       conversation_id=None, status=status, error_code=error_code, duration_ms=1)
    return AuditRecord(second, event, None, None)


def test_what_became_of_an_approvals_call_reads_from_its_audited_steps() -> None:
    runs = CallRuns.of([step("r-1", "error", "INVALID_ARGUMENT", 1), step("r-2", "dispatching", second=2),
                        step("r-2", "success", second=3), step("r-3", "error", "PERMISSION_DENIED", 4)])
    assert runs.ran is not None and (runs.ran.request_id, runs.ran.text) == ("r-2", "succeeded")
    assert runs.ran.at.isoformat() == "2026-12-01T10:00:02+00:00"  # when it started
    assert [a.text for a in runs.refused] == ["refused (INVALID_ARGUMENT)", "refused (PERMISSION_DENIED)"]
    failed = CallRuns.of([step("r-1", "dispatching"), step("r-1", "error", "TOOL_ERROR", 1)]).ran
    assert failed is not None and failed.text == "failed (TOOL_ERROR)"
    running = CallRuns.of([step("r-1", "dispatching")]).ran
    assert running is not None and running.text == "started; no outcome recorded yet"
    assert CallRuns.of([]).ran is None and CallRuns.of([]).refused == ()


def test_the_live_version_is_of_the_set_of_previews_and_their_hashes() -> None:
    a = Preview(preview_id="a", preview_hash="sha256:1", call_json="{}", reason="r", expires_at="2026-12-01T10:15:00Z")
    b = a.model_copy(update={"preview_id": "b"})
    assert version_of([a, b]) == version_of([b, a]) != version_of([a])
    assert version_of([a]) != version_of([a.model_copy(update={"preview_hash": "sha256:2"})])
    assert len(version_of([])) == 20 and version_of([]) != version_of([a])
