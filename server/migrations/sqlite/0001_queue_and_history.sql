-- The durable queue (pending and running prompts) and the history of finished prompts.
CREATE TABLE queue (
    id TEXT PRIMARY KEY NOT NULL,
    number REAL NOT NULL,
    seq INTEGER NOT NULL,
    running INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL
);

CREATE TABLE history (
    id TEXT PRIMARY KEY NOT NULL,
    seq INTEGER NOT NULL,
    number REAL NOT NULL,
    entry TEXT NOT NULL
);

CREATE INDEX history_by_seq ON history (seq);
