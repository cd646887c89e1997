"""The command layer: one module per ``lm-account`` command, usable without the command line.

Each module has a frozen ``Request`` whose construction performs every refusal the command makes
(an ``AccountingError``, before any work), ``run(request)`` returning the command's ``Result``, and,
where the command measures a live model, ``measure(request, result)`` returning the result with the
measurement attached.  ``cli`` only maps flags to a request, calls these and renders the result with
``views.render``.  No module here imports torch, pandas or matplotlib at import time: the analytic
commands never load them, and a measurement imports what it needs when it runs.
"""

from __future__ import annotations
