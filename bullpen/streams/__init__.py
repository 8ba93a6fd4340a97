"""Streams: the event log (coalesce, seq, group commit), buses and SSE."""
