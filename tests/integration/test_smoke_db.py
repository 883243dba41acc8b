def test_db_fixture_is_migrated(conn):
    row = conn.execute("SELECT count(*) AS n FROM action WHERE pack = 'core'").fetchone()
    assert row["n"] == 5  # the core pack's four, and core.ask (migration 0013)
