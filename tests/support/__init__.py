"""Helpers the tests import: servers, clients, seeds, processes. No tests and no fixtures here."""
