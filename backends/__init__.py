"""Identity backends. Each module implements :class:`backends.base.Backend`."""
