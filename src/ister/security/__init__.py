"""Security without the transport: certificate files, JWT validation and minting, RBAC, audit lines.

gRPC is not imported here (DESIGN §3): `ister.server.auth` and `ister.server.tls` put these to work.
"""
