"""Agent adapters: given a run, produce events and an outcome."""
