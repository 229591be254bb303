"""PostgreSQL connection strings: checked, and shown without their password."""

from __future__ import annotations

__all__ = ["DSN_FORMS", "dsn_parts", "redact_dsn"]

DSN_FORMS = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME or key=value pairs"


def dsn_parts(dsn: str) -> dict[str, str]:
    """The parameters of ``dsn``; ``ValueError`` if it is invalid.

    libpq's own message quotes the string, password included, so it is never passed on.
    """
    # psycopg is imported here, not at module level: configurations without PostgreSQL never pay for it.
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {name: str(value) for name, value in conninfo_to_dict(dsn).items()}
    except ProgrammingError:
        raise ValueError(f"not a valid PostgreSQL connection string; expected {DSN_FORMS}") from None


def redact_dsn(dsn: str) -> str:
    """``dsn`` as ``postgresql://USER@HOST:PORT/DBNAME``: no password, no other parameters."""
    parts = dsn_parts(dsn)
    user = f"{parts['user']}@" if "user" in parts else ""
    port = f":{parts['port']}" if "port" in parts else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"
