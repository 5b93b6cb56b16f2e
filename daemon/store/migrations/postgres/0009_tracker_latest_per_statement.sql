-- tracker_latest kept per statement instead of per row. The row trigger of 0004 upserted the
-- video's one tracker_latest row for every inserted snapshot, and PostgreSQL, updating a row
-- again in the same transaction, walks every version of it that transaction made: inserting
-- N snapshots of one video in one transaction (`crawld store copy`, a backfill, a test's COPY
-- of 50,000 rows) cost O(N²), 3.5 s at 20,000 and minutes at 100,000. The statement trigger
-- reads the statement's new rows and upserts each video once, with its newest snapshot.
CREATE OR REPLACE FUNCTION tracker_snapshots_latest() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO tracker_latest(aid, at_ms, views, danmakus, replies, likes, coins, shares, favorites)
    SELECT DISTINCT ON (aid) aid, at_ms, views, danmakus, replies, likes, coins, shares, favorites
    FROM tracker_snapshots_new ORDER BY aid, at_ms DESC
    ON CONFLICT (aid) DO UPDATE SET at_ms = excluded.at_ms, views = excluded.views,
        danmakus = excluded.danmakus, replies = excluded.replies, likes = excluded.likes,
        coins = excluded.coins, shares = excluded.shares, favorites = excluded.favorites
    WHERE excluded.at_ms >= tracker_latest.at_ms;
    RETURN NULL;
END $$;

DROP TRIGGER tracker_snapshots_latest ON tracker_snapshots;
CREATE TRIGGER tracker_snapshots_latest AFTER INSERT ON tracker_snapshots
REFERENCING NEW TABLE AS tracker_snapshots_new
FOR EACH STATEMENT EXECUTE FUNCTION tracker_snapshots_latest();
