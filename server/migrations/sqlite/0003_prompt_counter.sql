-- The prompt counter (the next number a prompt without a client `number` gets), kept so numbers keep growing
-- across restarts. Databases from before it continue after the highest number they hold.
CREATE TABLE counter (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    next INTEGER NOT NULL
);

INSERT INTO counter (id, next)
SELECT 0, COALESCE(MAX(CAST(ABS(number) AS INTEGER) + 1), 0)
FROM (SELECT number FROM queue UNION ALL SELECT number FROM history);
