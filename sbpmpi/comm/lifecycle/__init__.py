"""The job's life: where this process stands, and how the job ends when a rank fails.

:mod:`.world` (rank, size, the node split, made at ``import sbpmpi``; public as
``sm.env``), :mod:`.abort` (an uncaught exception on one rank ends the job), :mod:`.watchdog`
(a call stuck past the timeout ends the job; the exit watch), :mod:`.exit_agreement` (the
end of the program as a collective step: "finished" and "aborted" notices). These work
while a call is busy or broken, so they import no collective of :mod:`sbpmpi.comm`.
"""
