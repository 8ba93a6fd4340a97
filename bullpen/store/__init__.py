"""Persistence: tables, migrations and one module per aggregate (SQLite and PostgreSQL)."""
