"""The run stack: one job's run from its config to its record. ``runner`` resolves the device and starts the
ranks, ``repeats`` trains the timed part as often as configured, ``records`` writes what a run leaves, and
``lockstep`` checks a peer's store step by step against ``device``'s."""
