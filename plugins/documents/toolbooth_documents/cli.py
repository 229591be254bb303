"""``toolbooth-documents``: fill the document index, delete from it, list it.

    toolbooth-documents index DIR --tenant T --project P [--restricted]
    toolbooth-documents index --sample [--tenant dev] [--project toolbooth]
    toolbooth-documents delete DOCUMENT_ID
    toolbooth-documents list [--tenant T] [--project P]

Every command works on the index the sidecar's tools use: ``plugins.config.documents`` of the sidecar's config
file ``--config FILE`` and its ``TOOLBOOTH_*`` variables (``read_plugin_settings``), unless ``--db PATH`` or
``--postgres-dsn DSN`` names another. Exit codes: 0 done, 1 a file was skipped or the index failed, 2 bad usage
or a configuration error. Like ``toolbooth``'s commands (``sidecar.plugin_cli``), each takes ``--output json``
(a JSON document on stdout; a failure is a JSON object on stderr), ``list`` prints a table that fits the
terminal and ``index`` shows its progress on a terminal's stderr (``--no-progress``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sidecar.plugin import ConfigError, read_plugin_settings
from sidecar.plugin_cli import (
    Column,
    Parser,
    UsageError,
    error_document,
    json_errors,
    json_output,
    meter,
    output_flag,
    progress_flag,
    progress_wanted,
    render_table,
    requested_json,
)
from toolbooth_documents.index import Index, open_index
from toolbooth_documents.loader import load_directory
from toolbooth_documents.records import DOCUMENT_ID_PATTERN, Change, IndexUnavailable, Listed, check_name, rfc3339
from toolbooth_documents.settings import ConfigurationError, IndexSettings

__all__ = ["SAMPLE_PROJECT", "SAMPLE_TENANT", "main", "sample_directory"]

SAMPLE_TENANT, SAMPLE_PROJECT = "dev", "toolbooth"  # the dev-mode principal's tenant: the quickstart finds them


def sample_directory() -> Path:
    """The sample corpus shipped with the plugin (Markdown files about Toolbooth)."""
    return Path(str(resources.files("toolbooth_documents") / "sample"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code."""
    parser = _parser()
    words = sys.argv[1:] if argv is None else list(argv)
    token = json_errors.set(requested_json(words))
    try:
        return _main(parser, parser.parse_args(words))
    except UsageError as exc:
        return _fail(str(exc), 2, as_json=True)
    finally:
        json_errors.reset(token)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    as_json = json_output(args)
    try:
        settings = _settings(args)
    except ConfigError as exc:
        return _fail(str(exc), 2, as_json=as_json)
    try:
        index = open_index(settings)
        if args.command == "index":
            return asyncio.run(_index(parser, args, index, settings))
        if args.command == "delete":
            return asyncio.run(_delete(parser, args, index, settings))
        return asyncio.run(_list(args, index))
    except (ConfigurationError, IndexUnavailable) as exc:
        return _fail(str(exc), 1, as_json=as_json)


def _fail(message: str, code: int, *, as_json: bool) -> int:
    print(error_document(message, code) if as_json else f"toolbooth-documents: error: {message}", file=sys.stderr)
    return code


def _settings(args: argparse.Namespace) -> IndexSettings:
    """The plugin's settings of ``--config`` and the environment; ``--db`` or ``--postgres-dsn`` replace its index."""
    configured = read_plugin_settings("documents", IndexSettings, args.config)
    if args.db is not None:
        return configured.model_copy(update={"sqlite_path": args.db, "postgres_dsn": None})
    if args.postgres_dsn is None:
        return configured
    try:
        return IndexSettings.model_validate({**dict(configured), "postgres_dsn": args.postgres_dsn})
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"--postgres-dsn: {problem}") from None


async def _index(parser: argparse.ArgumentParser, args: argparse.Namespace, index: Index,
                 settings: IndexSettings) -> int:
    if (args.directory is None) == (not args.sample):
        parser.error("index: give a directory or --sample (not both)")
    tenant = args.tenant or (SAMPLE_TENANT if args.sample else None)
    project = args.project or (SAMPLE_PROJECT if args.sample else None)
    if tenant is None or project is None:
        parser.error("index: --tenant and --project are required with a directory")
    root = sample_directory() if args.sample else args.directory
    try:
        check_name("tenant", tenant)
        check_name("project", project)
    except ValueError as exc:
        parser.error(f"index: {exc}")
    if not root.is_dir():
        parser.error(f"index: {root} is not a directory")
    with meter(f"reading {root}", enabled=progress_wanted(args)) as shown:
        documents, skipped = load_directory(root, tenant=tenant, project_id=project, restricted=args.restricted,
                                            progress=shown.update)
        shown.describe(f"writing {len(documents)} document(s) to the index")
        await index.add_project(tenant, project)
        changes = await index.upsert(documents)
    counts = {change: sum(1 for c, _ in changes if c is change) for change in Change}
    if json_output(args):
        print(json.dumps({
            "index": settings.describe(), "tenant": tenant, "project": project,
            "documents": [{"change": change.value, "document_id": doc.document_id, "version": version,
                           "source": doc.source, "title": doc.title, "restricted": doc.restricted}
                          for doc, (change, version) in zip(documents, changes, strict=True)],
            "counts": {change.value: counts[change] for change in Change},
            "skipped": [{"path": str(skip.path), "reason": skip.reason} for skip in skipped]},
            indent=2, ensure_ascii=False))
        return 1 if skipped else 0
    for doc, (change, version) in zip(documents, changes, strict=True):
        print(f"{change.value:<9}  {doc.document_id}  v{version}  {doc.source}  {doc.title!r}"
              f"{'  (restricted)' if doc.restricted else ''}")
    for skip in skipped:
        print(f"skipped {skip.path}: {skip.reason}", file=sys.stderr)
    print(f"indexed {len(documents)} file(s) into {settings.describe()} (tenant {tenant}, project {project}): "
          + ", ".join(f"{counts[change]} {change.value}" for change in Change)
          + (f"; {len(skipped)} skipped" if skipped else ""))
    return 1 if skipped else 0


async def _delete(parser: argparse.ArgumentParser, args: argparse.Namespace, index: Index,
                  settings: IndexSettings) -> int:
    document_id = args.document_id
    if not re.match(DOCUMENT_ID_PATTERN, document_id):
        parser.error(f"delete: {document_id!r} is not a document id ('doc_' and 24 hexadecimal digits)")
    deleted = await index.delete(document_id)
    if deleted is None:
        return _fail(f"there is no document {document_id} in {settings.describe()}", 1, as_json=json_output(args))
    if json_output(args):
        print(json.dumps({"deleted": _listed(deleted)}, indent=2, ensure_ascii=False))
    else:
        print(f"deleted {deleted.document_id} v{deleted.version} (tenant {deleted.tenant}, "
              f"project {deleted.project_id}): {deleted.title!r}")
    return 0


async def _list(args: argparse.Namespace, index: Index) -> int:
    documents = await index.documents(args.tenant, args.project)
    if json_output(args):
        print(json.dumps([_listed(doc) for doc in documents], indent=2, ensure_ascii=False))
    else:
        print(render_table(_COLUMNS, [_row(doc) for doc in documents]))
    return 0


_COLUMNS = (Column("DOCUMENT ID"), Column("TENANT"), Column("PROJECT"), Column("VERSION", wrap=False),
            Column("RESTRICTED", wrap=False), Column("UPDATED AT", wrap=False), Column("TITLE"))


def _row(doc: Listed) -> tuple[str, ...]:
    return (doc.document_id, doc.tenant, doc.project_id, str(doc.version), "yes" if doc.restricted else "no",
            rfc3339(doc.updated_at), doc.title)


def _listed(doc: Listed) -> dict[str, Any]:
    return {"document_id": doc.document_id, "tenant": doc.tenant, "project": doc.project_id, "version": doc.version,
            "restricted": doc.restricted, "updated_at": rfc3339(doc.updated_at), "title": doc.title}


def _parser() -> argparse.ArgumentParser:
    where = Parser(add_help=False)
    backend = where.add_mutually_exclusive_group()
    where.add_argument("--config", type=Path, metavar="FILE",
                       help="the sidecar's YAML config file: its plugins.config.documents names the index "
                            "(default: none; TOOLBOOTH_PLUGINS__CONFIG__DOCUMENTS__* variables apply either way)")
    backend.add_argument("--db", type=Path, help="the SQLite index file (default: the configured one, else "
                                                 "$XDG_STATE_HOME/toolbooth/documents.db)")
    backend.add_argument("--postgres-dsn", help="a PostgreSQL database for the index (default: the configured one)")
    output_flag(where)
    parser = Parser(prog="toolbooth-documents", description="Fill and inspect the index that "
                                     "the search_documents and read_document tools search.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    index = commands.add_parser("index", parents=[where], help="index the Markdown and text files of a directory",
                                description="Index every *.md, *.markdown and *.txt file below DIR; a file "
                                            "indexed again with changes gets a new version.")
    index.add_argument("directory", nargs="?", type=Path, metavar="DIR")
    index.add_argument("--sample", action="store_true",
                       help=f"index the sample corpus (default tenant {SAMPLE_TENANT}, project {SAMPLE_PROJECT})")
    index.add_argument("--tenant", help="the organization the documents belong to")
    index.add_argument("--project", help="the project of that organization they belong to")
    index.add_argument("--restricted", action="store_true",
                       help="restricted documents: found by title only, no snippet, read only with "
                            "the permission documents:read_restricted")
    progress_flag(index)
    delete = commands.add_parser("delete", parents=[where], help="delete a document from the index")
    delete.add_argument("document_id", metavar="DOCUMENT_ID")
    listing = commands.add_parser("list", parents=[where], help="list the indexed documents")
    listing.add_argument("--tenant")
    listing.add_argument("--project")
    return parser
