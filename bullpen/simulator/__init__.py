"""The built-in simulated OpenAI-compatible provider: a fake shipped as product code.

`provider` serves it, `request` reads and checks request bodies, `script` plays scripted tool
calls and `faults` makes it misbehave the way real providers do.
"""
