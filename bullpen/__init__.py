"""Bullpen: a self-hosted control plane for teams of LLM agents."""

__version__ = "0.1.0"
