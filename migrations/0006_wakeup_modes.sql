-- Relays can be woken in two ways. `notify` (the default) is a pointer
-- NOTIFY at COMMIT, sent by the outbox trigger. `logical` sends nothing:
-- every relay decodes committed outbox inserts, and ephemeral events sent
-- as logical messages, from the write-ahead log, so emitting never takes
-- the cluster-wide lock NOTIFY holds through commit.
--
-- `eventrelay migrate` records the mode here and makes the rest follow:
-- it enables or disables the outbox_notify trigger and creates or drops
-- the publication relays decode (named after this schema). This file only
-- adds the record and makes the inline path read it.

ALTER TABLE settings ADD COLUMN wakeup text NOT NULL DEFAULT 'notify'
    CONSTRAINT settings_wakeup_known CHECK (wakeup IN ('notify', 'logical'));

-- An ephemeral event (or several sharing one payload) follows the mode:
-- a notification, or a transactional logical message whose prefix is the
-- channel. Both are delivered at COMMIT and discarded by ROLLBACK.
CREATE OR REPLACE FUNCTION notify_inline(payload text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    channel text := notify_channel();
BEGIN
    IF (SELECT wakeup FROM settings) = 'logical' THEN
        PERFORM pg_logical_emit_message(true, channel, payload);
    ELSE
        PERFORM pg_notify(channel, payload);
    END IF;
END
$$;
