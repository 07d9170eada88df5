-- The queue keyed by prompt id alone (one B-tree instead of a table and its id index): removing thousands of
-- pending prompts at once touches half the pages.
CREATE TABLE queue_by_id (
    id TEXT PRIMARY KEY NOT NULL,
    number REAL NOT NULL,
    seq INTEGER NOT NULL,
    running INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL
) WITHOUT ROWID;

INSERT INTO queue_by_id (id, number, seq, running, payload)
SELECT id, number, seq, running, payload FROM queue;

DROP TABLE queue;

ALTER TABLE queue_by_id RENAME TO queue;
