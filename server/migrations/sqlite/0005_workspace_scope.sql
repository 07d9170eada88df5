-- Queue and history rows belong to a workspace (the cloud runtime's tenants). Rows from before workspaces
-- existed, and every row of the local runtime, belong to the `default` workspace. A history entry is keyed by
-- workspace and prompt id, so one workspace can never replace another's entry.
ALTER TABLE queue ADD COLUMN workspace TEXT NOT NULL DEFAULT 'default';

CREATE TABLE history_in_workspace (
    workspace TEXT NOT NULL DEFAULT 'default',
    id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    number REAL NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (workspace, id)
);

INSERT INTO history_in_workspace (workspace, id, seq, number, entry)
SELECT 'default', id, seq, number, entry FROM history;

DROP TABLE history;

ALTER TABLE history_in_workspace RENAME TO history;

CREATE INDEX history_by_seq ON history (seq);
