"""Small programs that the fault tests run under their own mpiexec (not collected by pytest)."""
