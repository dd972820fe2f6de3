"""``hotcold bench``: the embedding step's kernels (``embedding``), a whole training step's host preparation
(``step``, its host operations counted by ``opcount``) and the sharding simulator's speed (``shardsim``)."""
