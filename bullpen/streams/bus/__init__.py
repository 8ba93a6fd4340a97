"""Buses carry committed run events to live subscribers."""
