"""The Snakemake workflow's decisions, unit-tested: its config (``settings``), what it runs (``matrix``, with
the batch checks' words in ``splits``), what the command line asks for (``targets``), schema errors in one line
(``schema``), the peer's availability (``peers``) and resuming after a killed run (``resume``)."""
