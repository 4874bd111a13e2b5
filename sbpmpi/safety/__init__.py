"""What keeps a job from hanging or going silently wrong: the cross-rank consistency
check (:mod:`.consistency`), the watchdog, the abort-on-error hook, the exit-time
agreement between ranks and the communication trace."""
