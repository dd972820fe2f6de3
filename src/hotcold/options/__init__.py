"""Typed options and the data they check against, apart from the algorithms (torchrec's ``types.py`` split):
the base class and the budgets (``base``), the one-process stores' options (``stores``), the scale-out stores'
options with the plans' names and defaults (``sharded``)."""
