"""A plugin's own command-line program, shaped like ``toolbooth``'s commands (``toolbooth-documents``).

``--output json`` with its JSON failures (``Parser``, ``output_flag``, ``json_output``, ``requested_json``,
``json_errors``, ``UsageError``, ``error_document``), tables fitted to the terminal (``Column``,
``render_table``) and progress on a terminal's stderr (``progress_flag``, ``progress_wanted``, ``meter``)::

    token = json_errors.set(requested_json(argv))  # usage errors of a --output json line raise UsageError
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(error_document(str(exc), 2), file=sys.stderr)
    finally:
        json_errors.reset(token)

Like ``sidecar.plugin``, this module is a promise to plugin authors: the names in ``__all__`` keep their meaning.
It is apart from ``sidecar.plugin`` so that a plugin's tools do not import the command line.
"""

from __future__ import annotations

from sidecar.cli.output import Parser, UsageError, error_document, json_errors, json_output, output_flag, requested_json
from sidecar.cli.progress import meter, progress_flag, progress_wanted
from sidecar.cli.table import Column, render_table

__all__ = [
    "Column",
    "Parser",
    "UsageError",
    "error_document",
    "json_errors",
    "json_output",
    "meter",
    "output_flag",
    "progress_flag",
    "progress_wanted",
    "render_table",
    "requested_json",
]
