"""The layers of a backend's stack, each wrapping the next (review/stack.py)."""
