"""``hotcold calibrate``: this machine's rates, measured by micro-benchmarks (``host``, ``network``, ``device``,
turned into rates by ``rates``) and written as a hardware profile (``profile``)."""
