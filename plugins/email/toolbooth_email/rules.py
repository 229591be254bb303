"""The sending rules (``settings.Rules``), applied to a message at preview and again at send time.

- **Blocked domains**: a recipient in a blocked domain, or a subdomain of one, refuses the message
  (``POLICY_VIOLATION``, ``safe_details.blocked_domains``).
- **Recipient limit**: more than ``max_recipients`` addresses in recipients, cc and bcc together refuses it
  (``POLICY_VIOLATION``, ``safe_details.max_recipients``).
- **External recipients**: a domain that is not internal (one of ``internal_domains`` or a subdomain, as the
  default Rego rule decides) is external. The preview warns (``EXTERNAL_RECIPIENT``); sending needs
  ``external_permission``, held directly or through one of ``external_roles`` (``PERMISSION_DENIED``).
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.plugin import ErrorCode, Principal, ToolError
from toolbooth_email.models import EmailContent, Mailbox, PreviewWarning
from toolbooth_email.settings import Rules

__all__ = ["check_message", "check_sender", "deduplicated", "domain", "external_domains", "warnings"]


def domain(address: str) -> str:
    """The domain of a normalized address, lower-cased."""
    return address.rpartition("@")[2].lower()


def _within(address: str, domains: Iterable[str]) -> bool:
    own = domain(address)
    return any(own == d.lower() or own.endswith("." + d.lower()) for d in domains)


def deduplicated(lists: Iterable[list[Mailbox]]) -> tuple[list[list[Mailbox]], list[PreviewWarning]]:
    """The lists with every address after its first appearance (in any list, ignoring case) dropped."""
    seen: set[str] = set()
    dropped: list[str] = []
    kept: list[list[Mailbox]] = []
    for boxes in lists:
        kept.append([])
        for box in boxes:
            if box.email.lower() in seen:
                dropped.append(box.email)
                continue
            seen.add(box.email.lower())
            kept[-1].append(box)
    notes = [PreviewWarning(code="DUPLICATE_RECIPIENT",
                            message=f"listed more than once, kept where it first appears: {', '.join(dropped)}")]
    return kept, notes if dropped else []


def external_domains(content: EmailContent, rules: Rules) -> list[str]:
    """The domains of the message's recipients outside the organization, sorted."""
    return sorted({domain(a) for a in content.envelope() if not _within(a, rules.internal_domains)})


def check_message(content: EmailContent, rules: Rules) -> None:
    """Refuse a message to a blocked domain or to too many recipients."""
    addresses = content.envelope()
    blocked = sorted({domain(a) for a in addresses if _within(a, rules.blocked_domains)})
    if blocked:
        raise ToolError(ErrorCode.POLICY_VIOLATION, f"sending to {', '.join(blocked)} is not allowed",
                        field="recipients", safe_details={"blocked_domains": blocked})
    if len(addresses) > rules.max_recipients:
        raise ToolError(ErrorCode.POLICY_VIOLATION,
                        f"{len(addresses)} recipients (recipients, cc and bcc together); "
                        f"at most {rules.max_recipients} are allowed",
                        field="recipients", safe_details={"max_recipients": rules.max_recipients,
                                                          "recipient_count": len(addresses)})


def check_sender(content: EmailContent, rules: Rules, principal: Principal) -> None:
    """Refuse a message with external recipients from a principal without the external permission."""
    external = external_domains(content, rules)
    allowed = (rules.external_permission in principal.permissions
               or bool(set(principal.roles) & set(rules.external_roles)))
    if external and not allowed:
        raise ToolError(ErrorCode.PERMISSION_DENIED,
                        f"sending to recipients outside the organization ({', '.join(external)}) needs permission "
                        f"{rules.external_permission}",
                        safe_details={"external_domains": external})


def warnings(content: EmailContent, rules: Rules) -> list[PreviewWarning]:
    """What the sender should know: recipients outside the organization."""
    external = external_domains(content, rules)
    if not external:
        return []
    return [PreviewWarning(code="EXTERNAL_RECIPIENT",
                           message=f"recipients outside your organization: {', '.join(external)}")]
