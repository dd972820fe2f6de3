"""The claims table: each seed paper's claim (``catalog``) beside the measured runs (``runs``, ``measured``,
``gpu``), the cost model at the papers' scale (``paper_scale``, ``paper_columns``), written (``table``), drawn
(``figure``) and assembled by ``hotcold claims`` (``report``)."""
