"""The inbox's pages and forms: sign in (a pasted token, dev mode, an identity provider), the pending previews
(with those that expired undecided in the last hour) and their live updates (``live``), one preview in any
state, approve, deny, history (with what became of each approved call, ``outcomes``), sign out.

Every decision goes through the ``ApprovalDesk`` the ``ApprovalService`` RPCs use: the list is what
``ListPreviews`` returns for the signed-in principal (the approver policy decides, operators see all),
approve binds the ``preview_hash`` the page showed, deny needs a reason, and both are audited with the
principal as approver by ``sidecar.pipeline.approvals``; the history lists the principal's own decisions
(an operator's: everyone's). Pages are rendered on the server (Jinja2, every
value escaped); a form that changes something must carry the session's CSRF token, the sign-in form a
one-time token of its own cookie. Refusals are pages that say what happened and that nothing changed; a
failing store or approver policy is a 503 page (fail closed: the details go to the log only).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sidecar.config.approvals_ui import CALLBACK_PATH
from sidecar.contract import ApprovalResult, ErrorCode
from sidecar.display import visible
from sidecar.errors import AuthenticationError, DependencyError, InvalidRequestError
from sidecar.server.approvals_ui.live import RETRY_AFTER_SECONDS, LiveUpdates
from sidecar.server.approvals_ui.oidc import LOGIN_SECONDS, OidcSignIn
from sidecar.server.approvals_ui.outcomes import CallRuns
from sidecar.server.approvals_ui.security import FormError, read_form
from sidecar.server.approvals_ui.sessions import Session, Sessions, SessionsFull, SignedIn, csrf_matches
from sidecar.server.approvals_ui.shown import shown
from sidecar.server.approvals_ui.signin import SignIn
from sidecar.server.approvals_ui.stream_slots import StreamSlots
from sidecar.server.approvals_ui.views import PreviewView
from sidecar.server.roles import MAX_LIST_LIMIT, ApprovalDesk, Approvers
from sidecar.state import AuditRecord

__all__ = ["Inbox"]

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_SIGN_IN_SECONDS = 600  # the sign-in form's own token lasts this long
_STATUS = {ErrorCode.PERMISSION_DENIED: 403, ErrorCode.RESOURCE_NOT_FOUND: 404, ErrorCode.PREVIEW_EXPIRED: 410,
           ErrorCode.SERVICE_UNAVAILABLE: 503, ErrorCode.INVALID_ARGUMENT: 409}
CHANGED = ("This preview changed since the page showed it, so nothing was approved. Read it again below: "
           "approving it now approves what it says now.")
FORGED = ("The form was refused: its security token is missing or wrong, so nothing changed. "
          "Reload the page and try again.")
EXPIRED = ("This preview expired before it was decided, so nothing was approved. The agent must send its call "
           "again to ask for a new approval.")
NOT_PENDING = "There is no such preview, or it is not yours to decide."
NOT_APPROVER = ("{who} holds none of the roles that may approve calls here ({roles}), so there is nothing here for "
                "them to approve or deny: nobody was signed in. Sign in with an approver's token.")
FULL = ("The inbox holds as many sessions as it may right now, so nobody was signed in (and nobody signed out). "
        "Try again later.")
EXPIRED_SHOWN = 3600  # seconds: previews that expired undecided this recently are listed in the inbox
_VERSION = re.compile(r"[0-9a-f]{20}")  # ``live.version_of``


class Inbox:
    """The inbox's ASGI app over one ``ApprovalDesk``; session cookies ``Secure`` when ``secure``."""

    def __init__(self, desk: ApprovalDesk, sign_in: SignIn, sessions: Sessions, *, approvers: Approvers,
                 secure: bool, page_size: int, live_seconds: float, streams: StreamSlots,
                 oidc: OidcSignIn | None = None) -> None:
        self._desk, self._sign_in, self._sessions, self._oidc = desk, sign_in, sessions, oidc
        self._approvers = approvers
        self._secure, self._page_size = secure, page_size
        self.live = LiveUpdates(desk, sessions, streams, interval=live_seconds)
        prefix = "__Host-" if secure else ""  # __Host-: Secure, Path=/, no Domain, enforced by the browser
        self.session_cookie, self.sign_in_cookie = f"{prefix}toolbooth-session", f"{prefix}toolbooth-sign-in"
        self.login_cookie = f"{prefix}toolbooth-login"  # an OIDC login's state, until the provider sends it back
        self._templates = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"),
                                             autoescape=True, undefined=jinja2.StrictUndefined)
        self._templates.filters["utc"] = lambda moment: moment.strftime("%Y-%m-%d %H:%M UTC")
        self._templates.filters["shown"] = shown
        self._templates.filters["visible"] = visible
        self._templates.globals["reload_seconds"] = RETRY_AFTER_SECONDS  # a page without live updates reloads so
        self.app = Starlette(routes=[
            Route("/", self._home),
            Route("/sign-in", self._sign_in_form, methods=["GET"]),
            Route("/sign-in", self._signing_in, methods=["POST"]),
            Route("/sign-in/oidc", self._oidc_begin, methods=["GET"]),
            Route(CALLBACK_PATH, self._oidc_callback, methods=["GET"]),
            Route("/sign-out", self._sign_out, methods=["POST"]),
            Route("/inbox", self._inbox, methods=["GET"]),
            Route("/inbox/events", self._events, methods=["GET"]),
            Route("/history", self._history, methods=["GET"]),
            Route("/previews/{preview_id}", self._preview, methods=["GET"]),
            Route("/previews/{preview_id}/approve", self._approve, methods=["POST"]),
            Route("/previews/{preview_id}/deny", self._deny, methods=["POST"]),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ], exception_handlers={DependencyError: self._unavailable})
        self.app.router.redirect_slashes = False  # /inbox/ is not found, never redirected to where Host says

    # --- signing in and out

    async def _home(self, request: Request) -> Response:
        return _see("/inbox" if self._session(request) else "/sign-in")

    async def _sign_in_form(self, request: Request, *, error: str | None = None, status: int = 200) -> Response:
        if error is None and self._session(request) is not None:
            return _see("/inbox")
        nonce = secrets.token_urlsafe(32)
        response = self._page("sign_in.html", None, status, csrf=nonce, method=self._sign_in.method, error=error,
                              oidc=self._oidc is not None)
        self._set_cookie(response, self.sign_in_cookie, nonce, _SIGN_IN_SECONDS)
        return response

    async def _signing_in(self, request: Request) -> Response:
        form = await _form(request)
        if isinstance(form, Response):
            return form
        nonce = request.cookies.get(self.sign_in_cookie)
        if not nonce or not csrf_matches(nonce, form.get("csrf")):
            return await self._sign_in_form(request, error=FORGED, status=403)
        try:
            signed_in = await self._sign_in.sign_in(form.get("token"))
        except AuthenticationError as exc:
            return await self._sign_in_form(request, error=f"Not signed in: {exc}.", status=401)
        return self._signed_in(signed_in, _see("/inbox"))

    async def _oidc_begin(self, request: Request) -> Response:
        # A link, not a form: a form's redirect to the provider would break "form-action 'self'". Starting a
        # login changes nothing but a pending state, which only the browser holding its cookie can finish.
        if self._oidc is None:
            return _see("/sign-in")
        try:
            state, url = await self._oidc.begin()
        except AuthenticationError as exc:
            return await self._sign_in_form(request, error=f"Not signed in: {exc}.", status=503)
        response = _see(url)
        # Lax, not Strict: the provider sends the browser back by a cross-site redirect, which carries Lax cookies only
        response.set_cookie(self.login_cookie, state, max_age=LOGIN_SECONDS, path="/", secure=self._secure,
                            httponly=True, samesite="lax")
        return response

    async def _oidc_callback(self, request: Request) -> Response:
        query, state = request.query_params, request.cookies.get(self.login_cookie)
        if self._oidc is None or not state or not csrf_matches(state, query.get("state")):
            return await self._sign_in_form(request, error="This sign-in did not start in this browser, or it "
                                            "already finished; nothing changed. Sign in again.", status=403)
        try:
            if query.get("error"):
                self._oidc.forget(state)
                raise AuthenticationError(f"the identity provider refused the sign-in: {query['error'][:200]}")
            signed_in = await self._oidc.finish(state, query.get("code", ""))
        except AuthenticationError as exc:
            response = await self._sign_in_form(request, error=f"Not signed in: {exc}.", status=401)
        else:  # a page, not a redirect: the session cookie is Strict, and this request came from the provider's site
            response = self._signed_in(signed_in, self._page("signed_in.html", None, 200))
        response.delete_cookie(self.login_cookie, path="/", secure=self._secure, httponly=True, samesite="lax")
        return response

    def _signed_in(self, signed_in: SignedIn, response: Response) -> Response:
        """``response`` with the cookie of a new session for ``signed_in``; a page saying why, and no session, for
        someone who is no approver or when the inbox holds its most sessions."""
        who = signed_in.principal
        if not self._approvers.includes(who):
            log.debug("approval inbox: %s (tenant %r) is no approver: not signed in", who.id, who.tenant)
            return self._page("message.html", None, 403, title="Not an approver", message=NOT_APPROVER.format(
                who=who.id, roles=", ".join(self._approvers.roles)))
        try:
            session = self._sessions.open(signed_in)
        except SessionsFull as exc:
            log.warning("approval inbox: %s (tenant %r) not signed in: %s", who.id, who.tenant, exc)
            return self._page("message.html", None, 503, title="Not signed in", message=FULL)
        log.info("approval inbox: %s (tenant %r) signed in (%s)", signed_in.principal.id, signed_in.principal.tenant,
                 signed_in.method)
        self._set_cookie(response, self.session_cookie, session.id, self._sessions.seconds_left(session))
        response.delete_cookie(self.sign_in_cookie, path="/", secure=self._secure, httponly=True, samesite="strict")
        return response

    async def closing(self, timeout: float) -> None:
        """The inbox is about to stop: end the open pages' live updates (before the listener waits for them)."""
        await self.live.close(timeout)

    async def aclose(self) -> None:
        """Close what the sign-in methods hold open (the identity provider's HTTP connections)."""
        if self._oidc is not None:
            await self._oidc.aclose()

    async def _sign_out(self, request: Request) -> Response:
        checked = await self._checked(request)
        if isinstance(checked, Response):
            return checked
        session, _ = checked
        self._sessions.close(session.id)
        log.info("approval inbox: %s (tenant %r) signed out", session.principal.id, session.principal.tenant)
        response = _see("/sign-in")
        response.delete_cookie(self.session_cookie, path="/", secure=self._secure, httponly=True, samesite="strict")
        return response

    # --- reading

    async def _inbox(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return _see("/sign-in")
        newest, version = await self.live.version(session)  # the filters' choices: the newest ones
        query = request.query_params
        tool, requester, after = query.get("tool", ""), query.get("requester", ""), query.get("after", "")
        matching = newest if not (tool or requester) else await self._desk.pending(
            session.principal, MAX_LIST_LIMIT, tool=tool or None, requester=requester or None)  # the count
        try:  # the newest page is the head of what was read already
            page = matching.head(self._page_size) if not after else await self._desk.pending(
                session.principal, self._page_size, after, tool=tool or None, requester=requester or None)
        except InvalidRequestError:  # a link no page gave (edited, or of another format): the newest page
            return _see(_inbox_link(tool, requester))
        views = [PreviewView.of(p) for p in newest.previews]
        tools = _choices([v.tool for v in views], tool)
        requesters = _choices([v.requester_id for v in views], requester)
        older = page.next_page_token and _inbox_link(tool, requester, page.next_page_token)
        expired = [PreviewView.of(p) for p in await self._desk.expired(session.principal, time.time() - EXPIRED_SHOWN)]
        return self._page("inbox.html", session, 200, previews=[PreviewView.of(p) for p in page.previews],
                          total=len(matching.previews), more=bool(matching.next_page_token), tools=tools,
                          requesters=requesters,
                          tool=tool, requester=requester, version=version, expired=expired, older=older,
                          newest=after and _inbox_link(tool, requester))

    async def _events(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return Response("not signed in", status_code=401, media_type="text/plain")
        since = request.query_params.get("since", "")
        return self.live.response(session, since if _VERSION.fullmatch(since) else "")

    async def _history(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return _see("/sign-in")
        decided = await self._desk.decided(session.principal)
        try:
            calls: dict[str, list[AuditRecord]] | None = await self._desk.calls_with(decided)
        except DependencyError as exc:  # the decisions still show; what became of their calls is said unknown
            log.error("approval inbox: reading the audit log for the history failed: %s", exc)
            calls = None
        runs = None if calls is None else {p.preview_id: CallRuns.of(calls.get(p.preview_id, ())) for p in decided}
        return self._page("history.html", session, 200, previews=[PreviewView.of(p) for p in decided], runs=runs)

    async def _preview(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return _see("/sign-in")
        return await self._detail(session, request.path_params["preview_id"])

    async def _detail(self, session: Session, preview_id: str, *, error: str | None = None,
                      status: int = 200) -> Response:
        found = await self._desk.visible(session.principal, preview_id)
        if found is None:
            return self._page("message.html", session, 404 if error is None else status, title="Not found",
                              message=error or NOT_PENDING)
        return self._page("preview.html", session, status, preview=PreviewView.of(found), error=error)

    # --- deciding

    async def _approve(self, request: Request) -> Response:
        return await self._decide(request, approve=True)

    async def _deny(self, request: Request) -> Response:
        return await self._decide(request, approve=False)

    async def _decide(self, request: Request, *, approve: bool) -> Response:
        checked = await self._checked(request)
        if isinstance(checked, Response):
            return checked
        (session, form), preview_id = checked, request.path_params["preview_id"]
        if approve:
            seen = form.get("preview_hash", "")
            if not seen:
                return await self._detail(session, preview_id, error="The form lacks the preview's hash; "
                                          "nothing was approved.", status=400)
            result = await self._desk.approve(session.principal, preview_id, seen, form.get("comment") or None)
        else:
            result = await self._desk.deny(session.principal, preview_id, form.get("reason", ""))
        if result.ok:
            assert result.preview is not None
            return self._page("decided.html", session, 200, preview=PreviewView.of(result.preview),
                              decided=result.preview)
        return await self._refused(session, preview_id, result)

    async def _refused(self, session: Session, preview_id: str, result: ApprovalResult) -> Response:
        assert result.error is not None
        error = result.error
        if error.field == "preview_hash":
            return await self._detail(session, preview_id, error=CHANGED, status=409)
        if error.code is ErrorCode.PREVIEW_EXPIRED:
            return await self._detail(session, preview_id, error=EXPIRED, status=410)
        if error.field in ("reason", "comment"):  # the approvals' own message, as the RPC gives it
            undone = "denied" if error.field == "reason" else "approved"
            return await self._detail(session, preview_id, error=f"Nothing was {undone}: {error.message}.", status=400)
        status = _STATUS.get(error.code, 409)
        return self._page("message.html", session, status, title="Not decided",
                          message=f"Nothing was decided: {error.message}.")

    async def _unavailable(self, request: Request, exc: Exception) -> Response:
        log.error("approval inbox: %s %s failed: %s", request.method, request.url.path, exc)
        return self._page("message.html", self._session(request), 503, title="Unavailable",
                          message="The approvals cannot be read right now, so nothing changed. Try again shortly.")

    # --- sessions, forms, pages

    def _session(self, request: Request) -> Session | None:
        return self._sessions.get(request.cookies.get(self.session_cookie))

    async def _checked(self, request: Request) -> tuple[Session, dict[str, str]] | Response:
        """The session of a state-changing POST and its form, or the refusal (no session, a bad form or CSRF)."""
        session = self._session(request)
        if session is None:
            return self._page("message.html", None, 401, title="Signed out",
                              message="You are not signed in (or your session ended), so nothing changed.")
        form = await _form(request)
        if isinstance(form, Response):
            return form
        if not csrf_matches(session.csrf, form.get("csrf")):
            return self._page("message.html", session, 403, title="Refused", message=FORGED)
        return session, form

    def _page(self, template: str, session: Session | None, status: int, **values: Any) -> HTMLResponse:
        page = self._templates.get_template(template).render(
            session=session, csrf_token=session.csrf if session else "", now=dt.datetime.now(dt.UTC), **values)
        return HTMLResponse(page, status_code=status)

    def _set_cookie(self, response: Response, name: str, value: str, seconds: int) -> None:
        response.set_cookie(name, value, max_age=seconds, path="/", secure=self._secure, httponly=True,
                            samesite="strict")


async def _form(request: Request) -> dict[str, str] | Response:
    try:
        return await read_form(request)
    except FormError as exc:
        return Response(str(exc), status_code=exc.status, media_type="text/plain")


def _see(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


def _choices(listed: Iterable[str], chosen: str) -> list[str]:
    """A filter's options: the values listed, and the one chosen even when none is listed now."""
    return sorted({*listed, chosen} - {""})


def _inbox_link(tool: str, requester: str, after: str = "") -> str:
    """The inbox's page with these filters, after the page token ``after`` (``""``: the newest)."""
    query = urlencode({name: value for name, value in (("tool", tool), ("requester", requester), ("after", after))
                       if value})
    return f"/inbox?{query}" if query else "/inbox"
