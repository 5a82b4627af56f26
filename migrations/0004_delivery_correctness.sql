-- What the relay needs to deliver exactly the right events.
--
-- `txid` records the transaction that wrote each row. A relay takes a
-- snapshot when a subscriber joins, and an event is new to that subscriber
-- exactly when its transaction was not yet visible in the snapshot: this
-- tells a late commit (a low seq that committed after the subscriber
-- joined) from history (a low seq that committed before), which seq
-- distance alone cannot. Rows written before this migration keep a NULL
-- txid and count as history.
ALTER TABLE outbox ADD COLUMN txid xid8;
ALTER TABLE outbox ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- Retention counts from when a row was written, never from `occurred_at`,
-- which callers may set to any time. `now()` fills existing rows with the
-- migration's time without rewriting the table; new rows get the clock.
ALTER TABLE outbox ADD COLUMN written_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE outbox ALTER COLUMN written_at SET DEFAULT clock_timestamp();
DROP INDEX outbox_occurred_at_idx;
CREATE INDEX outbox_written_at_idx ON outbox (written_at);

-- The highest seq pruning has deleted. A replay that starts below it may
-- have lost events, so the relay asks the client to re-read.
ALTER TABLE settings ADD COLUMN pruned_through bigint NOT NULL DEFAULT 0;

-- Event types that streams use for their own frames are refused at every
-- emit path, this one included (`emit()` and a plain INSERT). NOT VALID
-- leaves rows written before this migration alone; the relay withholds
-- them when it reads them.
ALTER TABLE outbox ADD CONSTRAINT outbox_type_not_reserved
    CHECK (type NOT IN ('ready', 'open', 'error') AND NOT starts_with(type, 'eventrelay.'))
    NOT VALID;
