"""A Danube-protocol gRPC server that stores nothing: see `ister.benchmark.noop_server`.

usage: python bench/noop_server.py PORT
"""

from __future__ import annotations

from ister.benchmark.noop_server import main

if __name__ == "__main__":
    main()
