"""The seam between the broker and the placement of topics (standalone or cluster): small protocols and the
values they exchange, below both sides, so `broker/` and `cluster/` never import each other.

- `placement.Placement`: the data path's questions (is a topic served here, where else, claim it, move it);
- `claim.TopicClaim`, `claim.ReplicationGate`: the fence on one loaded topic and its replication leader;
- `host.TopicHost`, `host.TopicStats`: what a placement needs from the broker service;
- `placement_admin.PlacementAdmin`: the admin API's view of placement (owners, brokers, drain, balance);
- `health.Check`: one readiness condition, as either side reports it.

app.py (the composition root) builds one mode's implementations and plugs them in.
"""
