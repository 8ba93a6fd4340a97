"""Bullpen as an MCP server (`server.py`) with its tools (`tools.py`); docs/mcp.md."""
