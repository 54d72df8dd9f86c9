"""``python tests/fakes serve MODEL ...`` (a path, what ``fakes.LAUNCHER`` runs) or ``python -m fakes serve ...``:
the ``vllm serve`` stand-in of fakes/serve.py."""

import sys
from pathlib import Path

if not __package__:  # run by path: this directory is sys.path[0]; put tests/ there so `fakes` is a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from fakes.serve import main  # noqa: E402

raise SystemExit(main())
