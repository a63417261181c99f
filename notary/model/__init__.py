"""The notary's domain model: targets, observations and timelines, the address policy, rate limits and rescan rules. Pure: no I/O, no Trio, no clock reads (time is a parameter)."""
