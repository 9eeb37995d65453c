"""`ister console`: a web console served by Ister, reading the broker's admin gRPC API only."""
