"""Where Gavel's public data lies (measured throughputs and traces, MIT licence).

``$HETSCHED_GAVEL_DATA`` names the folder (it holds ``simulation_throughputs.json``
and ``traces/``); without it, the benchmarks look for ``shared/data/gavel`` beside
the checkout, where this project's workspace keeps it. The bundled
``examples/gavel_throughputs.csv`` is a converted copy of the throughputs.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GAVEL = Path(os.environ.get("HETSCHED_GAVEL_DATA")
             or ROOT.parent / "shared" / "data" / "gavel")
TRACES = GAVEL / "traces"
MISSING = "trace not found (set HETSCHED_GAVEL_DATA to Gavel's data folder)"
