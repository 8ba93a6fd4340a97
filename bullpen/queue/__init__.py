"""The run queue: claim, lease, execute."""
