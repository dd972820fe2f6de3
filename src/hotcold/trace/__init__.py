"""Access traces of the embedding lookups: per-row counts and skew profiles (``profile``, ``hotcold profile``),
and the simulators that replay them through the live stores' policies (``cachesim``, ``faesim``, ``stackdist``,
``sweeps``, ``curves``; the policies themselves are ``hotcold.policies``)."""
