"""Use cases: what callers can do, independent of HTTP."""
