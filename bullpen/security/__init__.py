"""Security primitives below the services: sealing secrets, hashing passwords, rate limits, and
the outbound guard (which destinations a webhook agent or a provider may call).

A leaf: it imports the standard library, `settings`, `errors` and `domain` (and the
cryptography, argon2 and aiohttp libraries it wraps), never api, store, services, queue or
agents.
"""
