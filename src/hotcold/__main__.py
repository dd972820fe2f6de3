"""``python -m hotcold``: the ``hotcold`` command (``hotcold.cli.main``); torchrun starts a run's ranks this way."""
from hotcold.cli import main

raise SystemExit(main())
