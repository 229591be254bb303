"""Process isolation for sync handlers: the worker processes of a plugin, so a runaway handler can be stopped.

``plan`` checks the ``isolation`` settings against the loaded tools; ``paths`` finds a handler by its
import path; ``protocol`` is what crosses the socket of a worker; ``worker`` runs in the worker
process; ``process`` is one worker seen from the sidecar; ``pool`` keeps each plugin's workers.
``sidecar.tools.dispatch`` sends the calls of isolated tools there.
"""

from __future__ import annotations

__all__: list[str] = []
