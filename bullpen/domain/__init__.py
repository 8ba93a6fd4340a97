"""Pure domain types and rules (stdlib only)."""
