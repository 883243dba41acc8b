"""Pure domain layer: statuses, the transition graph, value types. No I/O here."""
