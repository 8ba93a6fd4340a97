"""Wire schemas: what the API accepts and returns (the domain never sees these).

One module per resource; `common` holds what they share. Route modules import from here.
"""
