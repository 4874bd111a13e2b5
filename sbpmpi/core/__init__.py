"""The pure layout vocabulary: SBP, placement, layout and box arithmetic, reductions,
the counter-based random streams. No MPI, no arrays of data: every function here is a
function of metadata, testable without ``mpiexec``."""
