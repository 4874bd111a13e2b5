"""Tools around the library: ``python -m sbpmpi info|bench|plot`` (:mod:`.cli`), the
launcher (:mod:`.launch`, ``python -m sbpmpi.launch``), the boxing benchmark and its
plot. The library never imports this package."""
