"""The schema registry: compiling definitions, storing subjects under the `/schemas/...` keys of
docs/metadata.md with compare-and-set, and validating topics' payloads (pure rules live in
`ister.core.schema`)."""
