"""The schema registry: compiling definitions, storing subjects under seed 003's `/schemas/...` keys with
compare-and-set, and validating topics' payloads (pure rules live in `ister.core.schema`)."""
