"""The policies the live stores and the simulators share: the caches' directory and eviction orders
(``directory``, its compiled ``kernels``, ``heaps`` and ``victims``), ScratchPipe's scratchpad (``scratchpad``,
``scratch_kernels``), FAE's hot set and schedule (``fae_schedule``), a batch trace with each row's next use
(``batches``) and per-row counts (``row_counts``). One implementation: the simulator's counts are the stores'
counters. Their budgets are data beside the options (``options.base``)."""
