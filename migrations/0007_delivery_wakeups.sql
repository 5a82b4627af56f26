-- Webhook workers are woken only by transactions that queued deliveries.
-- Relays used to wake their webhook workers on every pointer, so every
-- commit cost each relay a claim query and a next-due query, even where no
-- subscription exists. Now, in notify mode, the trigger that queues
-- deliveries also sends `{"k":"due"}` on the channel when it queued any
-- (identical payloads of one transaction arrive once). In logical mode the
-- relays see the delivery rows in the stream and send nothing here.

CREATE OR REPLACE FUNCTION outbox_enqueue_webhooks() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_deliveries (subscription_id, event_seq, event_id, event_type, scope_key, payload)
    SELECT s.id, n.seq, n.id, n.type, n.scope_key,
           jsonb_build_object(
               'id', n.id,
               'type', n.type,
               'scopeKey', n.scope_key,
               'lane', 'durable',
               'seq', n.seq,
               'data', n.data,
               'resources', to_jsonb(n.resources),
               'occurredAt', to_char(n.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           )
    FROM new_rows n
    JOIN webhook_subscriptions s
      ON (s.scope_key IS NULL OR s.scope_key = n.scope_key)
     AND webhook_type_matches(s.types, n.type)
    ORDER BY n.seq, s.id;
    IF FOUND AND (SELECT wakeup FROM settings) = 'notify' THEN
        PERFORM pg_notify(notify_channel(), '{"k":"due"}');
    END IF;
    RETURN NULL;
END
$$;
