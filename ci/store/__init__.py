"""Where releases live: the ReleaseStore protocol and its implementations."""
