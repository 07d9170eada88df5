-- Several Kiln processes on one database (`kiln --role api|worker`, `cluster/`). A worker claims a pending
-- prompt by setting `running`, its name and a lease it renews while the prompt runs; `attempt` counts the claims
-- and fences every later write of the claim (a worker whose lease was taken back cannot finish the prompt); a
-- client's interrupt is a flag the running worker reads with its heartbeat. `max_attempts` is the claiming
-- worker's `--max-attempts`: a prompt whose lease runs out is queued again until it has had that many.
ALTER TABLE queue ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE queue ADD COLUMN worker TEXT;
ALTER TABLE queue ADD COLUMN lease_until TIMESTAMPTZ;
ALTER TABLE queue ADD COLUMN interrupt BOOLEAN NOT NULL DEFAULT FALSE;

-- Claims take the first pending prompt in ComfyUI's order: number, then arrival.
CREATE INDEX queue_pending ON queue (number, seq) WHERE running = 0;

-- Arrival order across API nodes (a single server numbers arrivals in memory, continuing after the stored ones).
CREATE SEQUENCE queue_seq;

-- ComfyUI's prompt numbers across API nodes: a sequence, so taking one neither waits on a row lock nor on a
-- commit (a single server keeps its counter in `counter`; each mode starts past the other's numbers).
CREATE SEQUENCE prompt_number MINVALUE 0 START 0;

-- The outbox: what workers tell the clients (websocket messages, previews, which prompt runs where) and what
-- every API node must learn (a history entry stored or removed), in commit order. NOTIFY `kiln_events` is only a
-- wake-up hint: API nodes read the rows after the last one they delivered. Rows older than a few minutes go.
CREATE TABLE events (
    id BIGSERIAL PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    body TEXT NOT NULL
);

-- Model affinity: the model files a prompt names, and when it was queued. A worker takes first the prompts whose
-- files it holds (or that name none), in order, and a prompt that waited longer than the affinity wait joins
-- them, so nobody starves (`claims.rs`).
ALTER TABLE queue ADD COLUMN models TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE queue ADD COLUMN queued_at TIMESTAMPTZ NOT NULL DEFAULT now();
