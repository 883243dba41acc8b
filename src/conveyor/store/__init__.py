"""Storage layer: SQL in .sql files of named queries, numbered migrations, connections."""
