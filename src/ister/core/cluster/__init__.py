"""Pure cluster logic: broker choice, failover and assignment planning, offset continuity. No I/O."""
