"""The gateway: every LLM call goes through here."""
