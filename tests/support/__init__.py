"""Helpers that start real processes on loopback for the tests."""
