"""The policies the live stores and the simulators share: budgets as data (``budgets``), the caches' directory
and eviction orders (``directory``, its compiled ``kernels``, ``heaps`` and ``victims``), ScratchPipe's
scratchpad (``scratchpad``, ``scratch_kernels``), FAE's hot set and schedule (``fae_schedule``) and per-row
counts (``row_counts``). One implementation: the simulator's counts are the stores' counters."""
