"""The `ister` command (`ister.cli.main`)."""

from ister.grpc_io import prefer_classic_io

prefer_classic_io()  # before any module of the command imports grpc
