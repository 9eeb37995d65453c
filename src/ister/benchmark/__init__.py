"""`ister bench`: the throughput/latency suite (batch API, danube-client, NATS JetStream peer).

suite.run(Options) -> one JSON-able dict; report.render / report.to_json print it. Method and results:
docs/benchmarks.md. Nothing here is imported by the broker or the client.
"""
