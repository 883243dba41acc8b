-- compatible-from: 30
-- Rolling upgrades (docs/deployment.md, "Upgrades"). Every migration may declare, in a
-- header line like the one above, the oldest schema version whose code still works once it
-- is applied: an *expand* migration (a new table, a nullable column, a new function, a
-- wider check) keeps the previous release's processes working, so they go on running --
-- and may restart -- while the new release starts beside them. migrate.py records the
-- declaration here; a process that finds migrations newer than it knows starts when each
-- of them declares a version it has, and refuses otherwise (a *contract* migration, which
-- declares nothing: its own version). NULL: applied before this column existed, or
-- declaring nothing -- the migration's own version.
ALTER TABLE schema_migration ADD COLUMN compatible_from integer
    CHECK (compatible_from >= 1 AND compatible_from <= version);

COMMENT ON COLUMN schema_migration.compatible_from IS
    'oldest schema version whose code may run once this migration is applied (NULL: this version)';
