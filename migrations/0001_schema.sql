-- eventrelay's schema: the transactional outbox, the SQL side of emitting
-- and of waking relays, and webhooks.
--
-- Applied by `eventrelay migrate` (and at service start) with `search_path`
-- set to the configured schema (default `eventrelay`) followed by pg_temp,
-- so every name below is created in that schema. Functions that read
-- tables capture that search_path (SET search_path FROM CURRENT), so they
-- keep working whatever the caller's search_path is, and no temporary
-- table can stand in for one of ours (pg_temp is searched last, not
-- first). After this file the runner writes the settings row (the
-- channel), the notification key and `seal`, revokes everything from
-- PUBLIC, and applies the wake-up mode.
--
-- Privileges: the functions an application calls to emit (`emit`,
-- `emit_batch`, `notify_inline`) and the outbox's triggers are SECURITY
-- DEFINER: they run as the schema's owner, so an emitting role needs only
-- EXECUTE on them and can neither write the webhook tables nor read the
-- notification key. `eventrelay migrate --print-grants` prints the roles.


-- ---------------------------------------------------------------------------
-- Settings
-- ---------------------------------------------------------------------------

-- What the SQL side needs to know; exactly one row, written by the
-- migration runner.
CREATE TABLE settings (
    singleton boolean PRIMARY KEY DEFAULT true CONSTRAINT settings_single_row CHECK (singleton),
    -- The channel notifications go out on (and the prefix of logical
    -- messages in the logical wake-up mode).
    channel   text NOT NULL CONSTRAINT settings_channel_not_empty CHECK (channel <> ''),
    -- The highest seq pruning has deleted. A replay that starts below it
    -- may have lost events, so the relay asks the client to re-read.
    pruned_through bigint NOT NULL DEFAULT 0,
    -- The newest transaction among the rows pruning has deleted. A resume
    -- cursor whose horizon is at or below it may be owed a late commit
    -- that is gone, so the relay asks that client to re-read too.
    pruned_txid xid8 NOT NULL DEFAULT '0',
    -- How relays are woken. `notify`: a pointer NOTIFY at COMMIT, sent by
    -- the outbox_notify trigger. `logical`: nothing is sent at commit;
    -- every relay decodes committed outbox inserts, and ephemeral events
    -- sent as logical messages, from the write-ahead log, so emitting never
    -- takes the cluster-wide lock NOTIFY holds through commit. The runner
    -- records the mode here and makes the rest follow: it enables or
    -- disables the outbox_notify trigger and creates or drops the
    -- publication relays decode (named after this schema).
    wakeup    text NOT NULL DEFAULT 'notify'
        CONSTRAINT settings_wakeup_known CHECK (wakeup IN ('notify', 'logical')),
    -- The size rules a carrying pointer is built under; outbox_notify reads
    -- them with the channel, in the one query it makes here. The largest
    -- payload to send before sealing: Postgres refuses a NOTIFY payload of
    -- 8000 bytes or more, and sealing adds the IV, padding and tag and
    -- then a third for base64 (MAX_NOTIFY_PAYLOAD_BYTES). The room reserved for the pointer's own fields around its rows
    -- and scope key: the kind, `q` and `x` at their longest (19 and 20
    -- digits) and the brackets, which take 72 bytes. Writers that plan
    -- pointers themselves (see outbox_announce_rows) reckon with the same
    -- two numbers, so they must be kept equal to the ones compiled into
    -- eventrelay (MAX_NOTIFY_PAYLOAD_BYTES and POINTER_OVERHEAD).
    max_notify_payload integer NOT NULL DEFAULT 5934,
    pointer_overhead   integer NOT NULL DEFAULT 80,
    -- Whether notifications are sealed (see `seal`). Only the embedded
    -- database, one in-process session nobody else can reach, runs
    -- without; a relay on a Postgres server refuses to.
    sealed    boolean NOT NULL DEFAULT true,
    CONSTRAINT settings_notify_limits_valid
        CHECK (max_notify_payload < 8000 AND pointer_overhead >= 72)
);

-- The key notifications are sealed with: 32 bytes of AES-256 key, then 32
-- of HMAC-SHA256 key, written once by the migration runner from the
-- server's random source. Only the owner (through the functions below) and
-- the relay's role may read it: whoever reads it can read and forge the
-- channel.
CREATE TABLE notify_key (
    singleton boolean PRIMARY KEY DEFAULT true CONSTRAINT notify_key_single_row CHECK (singleton),
    key       bytea NOT NULL CONSTRAINT notify_key_length CHECK (octet_length(key) = 64)
);

-- Seals one payload for the channel: `origin` (one letter) and the
-- payload, AES-256-CBC with a random IV, then HMAC-SHA256 over IV and
-- ciphertext, in base64 (the relay's side is the wire crate's `seal`
-- module). The origin tells the relay what the sender could choose: `P`
-- for what these functions wrote from committed rows (pointers, `due`),
-- `E` for an ephemeral event as its emitter encoded it, which a relay
-- takes only as ephemeral events. This is the one body: pgcrypto may live
-- in any schema, so the migration runner pins this function's search_path
-- to pg_catalog, pgcrypto's schema and this one after the file, and
-- writes the key. A schema with no key refuses, unless its settings say
-- the channel is open (the embedded database's), where the payload goes
-- as it is. Every pgcrypto call has exact argument types, so no function
-- of the same name in a schema others can write to is a better match.
CREATE FUNCTION seal(origin text, payload text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k bytea;
    iv bytea;
    body bytea;
BEGIN
    SELECT n.key INTO k FROM notify_key n;
    IF k IS NULL THEN
        IF (SELECT NOT s.sealed FROM settings s) THEN
            RETURN payload;
        END IF;
        RAISE EXCEPTION 'eventrelay: notification sealing is not set up; run `eventrelay migrate`';
    END IF;
    iv := gen_random_bytes(16);
    body := iv || encrypt_iv(convert_to(origin || payload, 'UTF8'), substring(k FROM 1 FOR 32), iv,
                             'aes-cbc/pad:pkcs'::text);
    -- `encode` breaks base64 into lines of 76; `replace` drops the breaks
    -- several times faster than `translate`, which walks character by
    -- character (a 5,900-byte payload sealed in a third of the time).
    RETURN replace(encode(body || hmac(body, substring(k FROM 33 FOR 32), 'sha256'::text), 'base64'),
                   E'\n', '');
END
$$;

-- The channel notifications go out on; fails loudly when it was never set.
CREATE FUNCTION notify_channel() RETURNS text
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    configured text;
BEGIN
    SELECT channel INTO configured FROM settings;
    IF configured IS NULL THEN
        RAISE EXCEPTION 'eventrelay: no notification channel is configured; run `eventrelay migrate`';
    END IF;
    RETURN configured;
END
$$;


-- ---------------------------------------------------------------------------
-- The outbox
-- ---------------------------------------------------------------------------

-- One row per durable event. `seq` is the replay watermark; it is assigned
-- at INSERT and becomes visible at COMMIT, so readers must tolerate a lower
-- seq appearing after a higher one.
CREATE TABLE outbox (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          uuid        NOT NULL CONSTRAINT outbox_id_unique UNIQUE,
    type        text        NOT NULL
        CONSTRAINT outbox_type_valid
        CHECK (type <> '' AND octet_length(type) <= 200 AND type !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'),
    scope_key   text        NOT NULL
        CONSTRAINT outbox_scope_key_valid
        CHECK (scope_key <> '' AND octet_length(scope_key) <= 200 AND scope_key !~ '[\x01-\x1f\x7f-\x9f]'),
    lane        text        NOT NULL DEFAULT 'durable'
        CONSTRAINT outbox_lane_durable CHECK (lane = 'durable'),
    data        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- Only the keys `users` (an array of strings) and `permission` (opaque):
    -- an audience rule the relay does not understand must never be stored.
    audience    jsonb
        CONSTRAINT outbox_audience_valid
        CHECK (audience IS NULL OR (
            jsonb_typeof(audience) = 'object'
            AND audience - 'users' - 'permission' = '{}'::jsonb
            AND (NOT audience ? 'users' OR jsonb_typeof(audience -> 'users') IN ('array', 'null'))
            AND NOT jsonb_path_exists(audience, '$.users[*] ? (@.type() != "string")')
        )),
    resources   text[]      NOT NULL DEFAULT '{}',
    -- When the event happened, as the caller says; may be any time.
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The transaction that wrote the row; every writer leaves it to this
    -- default. A relay takes a snapshot when a subscriber joins, and an
    -- event is new to that subscriber exactly when its transaction was not
    -- yet visible in the snapshot: this tells a late commit (a low seq that
    -- committed after the subscriber joined) from history (a low seq that
    -- committed before), which seq distance alone cannot.
    txid        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- When the row was written. Retention counts from here, never from
    -- `occurred_at`, which callers may set to any time.
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The statement that wrote the row sent its pointer itself
    -- (outbox_announce_rows), so the outbox trigger leaves it out. Only
    -- roles trusted with the outbox (the owner, the relay's) can write a
    -- row directly; the emit functions never set this, so no setting an
    -- emitter can change keeps its events from being announced.
    announced   boolean     NOT NULL DEFAULT false,
    -- A row the relay wrote itself, about itself. Only such a row may carry
    -- one of the relay's own events (see below); emit(), emit_batch() and
    -- the publish API never mark a row, and an emitting role cannot write
    -- the table otherwise.
    system      boolean     NOT NULL DEFAULT false,
    -- The W3C trace context the event continues, as given at publish (the
    -- emit functions keep only a well-formed value). Relays continue the
    -- trace; a malformed value is ignored there, never an error.
    traceparent text,
    -- Event types that streams use for their own frames are refused at
    -- every emit path: emit(), the batch INSERT, and a plain INSERT. The
    -- `eventrelay.` prefix is the relay's: a system row may carry the
    -- relay's own events under it, and nothing else may.
    CONSTRAINT outbox_type_not_reserved
        CHECK (type NOT IN ('ready', 'open', 'error', 'reauth', 'revoked', 'presence')
               AND (NOT starts_with(type, 'eventrelay.')
                    OR (system AND type IN ('eventrelay.subscription.paused'))))
);

-- Reading a scope after a seq (live relay and replay).
CREATE INDEX outbox_scope_seq_idx ON outbox (scope_key, seq);
-- Reading what a scope's transactions at or above a horizon wrote,
-- whatever their seqs: a relay's re-reads, and a resume's late commits.
CREATE INDEX outbox_scope_txid_idx ON outbox (scope_key, txid);
-- Pruning by age.
CREATE INDEX outbox_written_at_idx ON outbox (written_at);


-- ---------------------------------------------------------------------------
-- The envelope
-- ---------------------------------------------------------------------------

-- A caller's `traceparent` if it is well-formed (W3C, version 00), else
-- NULL: a malformed one is dropped, never an error that loses the event.
CREATE FUNCTION valid_traceparent(traceparent text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                 AND substr(traceparent, 4, 32) <> repeat('0', 32)
                 AND substr(traceparent, 37, 16) <> repeat('0', 16)
                THEN traceparent
           END
$$;

-- One outbox row as the JSON envelope relays see, its fields in the wire
-- envelope's order (`audience` is null when unset), and the row's
-- `traceparent` last, only when it has one: an untraced event's envelope,
-- every byte of which travels on the channel, is as it was. Notifications
-- carry it as it is; a webhook delivery's body is the same envelope without
-- `audience` and `traceparent` (see outbox_enqueue_webhooks), so both are
-- built here and nowhere else. A plain SQL function without a SET clause,
-- so a query calling it has it inlined.
CREATE FUNCTION outbox_envelope(n outbox) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT left(json_build_object(
               'id', n.id,
               'type', n.type,
               'scopeKey', n.scope_key,
               'lane', 'durable',
               'seq', n.seq,
               'data', n.data,
               'audience', n.audience,
               'resources', n.resources,
               'occurredAt', to_char(n.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           )::text, -1)
           || coalesce(',"traceparent":' || to_json(n.traceparent)::text, '')
           || '}'
$$;


-- ---------------------------------------------------------------------------
-- Waking relays
-- ---------------------------------------------------------------------------
--
-- In the notify wake-up mode every committed outbox row wakes the relays
-- with a pointer on the channel. A pointer carries the rows it points at,
-- `{"k":"ptr","s":scope,"q":lowest seq,"x":txid,"r":[envelope, ...]}`,
-- split over as many pointers as keep each payload within the limit in
-- `settings`, so a relay hands the rows on without reading them back. A row
-- too large to travel sends a bare pointer `{"k":"ptr","s":scope,"q":seq}`
-- instead, and the relay reads the scope from that seq after COMMIT.
-- NOTIFY is transactional: pointers are sent at COMMIT and discarded by
-- ROLLBACK, together with the rows.

-- A carrying pointer's text. STABLE, as `format` is: a function declared
-- IMMUTABLE around a STABLE body is not inlined, and a SQL function that
-- is not inlined is parsed and planned again on every call.
CREATE FUNCTION outbox_carrying_pointer(scope_json text, seq bigint, txid xid8, carried text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT format('{"k":"ptr","s":%s,"q":%s,"x":%s,"r":[%s]}', scope_json, seq, txid, carried)
$$;

-- Runs once per INSERT statement (not per row): one set-based pass over
-- the statement's new rows costs less than per-row trigger calls. It sends
-- the pointers for the scopes the statement wrote, in order of their
-- lowest seqs, leaving out rows their statement announced itself
-- (`announced`). It trusts no setting: every session may set any custom
-- setting, so one it read could let an emitter keep its own events from
-- being announced. After a bare pointer, a later statement of the same
-- transaction writing to that scope sends its own pointer too; a relay
-- that has read past its seqs ignores it without a read.
--
-- In the logical wake-up mode this trigger is disabled by the runner.
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    channel text;
    max_payload int;
    overhead int;
    scope record;
    written record;
    scope_json text;
    carried text;
    first_seq bigint;
    carried_txid xid8;
BEGIN
    -- A statement that announced all its rows itself: nothing to read.
    IF NOT EXISTS (SELECT 1 FROM new_rows n WHERE NOT n.announced) THEN
        RETURN NULL;
    END IF;
    SELECT s.channel, s.max_notify_payload, s.pointer_overhead
      INTO channel, max_payload, overhead
      FROM settings s;
    IF NOT FOUND THEN
        -- Raises the error that names the missing setting.
        channel := notify_channel();
    END IF;
    -- Most statements write few small rows per scope: one query builds
    -- each scope's whole pointer, and only a scope whose rows do not fit
    -- in one payload is walked row by row.
    FOR scope IN
        SELECT n.scope_key,
               min(n.seq) AS first_seq,
               (array_agg(n.txid ORDER BY n.seq))[1] AS txid,
               string_agg(outbox_envelope(n), ',' ORDER BY n.seq) AS carried
        FROM new_rows n
        WHERE NOT n.announced
        GROUP BY n.scope_key
        ORDER BY 2
    LOOP
        scope_json := to_json(scope.scope_key)::text;
        IF octet_length(scope.carried) + octet_length(scope_json) + overhead <= max_payload THEN
            PERFORM pg_notify(channel, seal('P', outbox_carrying_pointer(scope_json, scope.first_seq, scope.txid, scope.carried)));
            CONTINUE;
        END IF;
        carried := '';
        FOR written IN
            SELECT n.seq, n.txid, outbox_envelope(n) AS envelope
            FROM new_rows n
            WHERE n.scope_key = scope.scope_key AND NOT n.announced
            ORDER BY n.seq
        LOOP
            IF octet_length(written.envelope) + octet_length(scope_json) + overhead > max_payload THEN
                -- This row cannot travel: the rows gathered so far, then a
                -- bare pointer, whose read finds the rest of this scope.
                IF carried <> '' THEN
                    PERFORM pg_notify(channel, seal('P', outbox_carrying_pointer(scope_json, first_seq, carried_txid, carried)));
                    carried := '';
                END IF;
                PERFORM pg_notify(channel, seal('P', format('{"k":"ptr","s":%s,"q":%s}', scope_json, written.seq)));
                EXIT;
            END IF;
            IF carried <> '' AND octet_length(carried) + 1 + octet_length(written.envelope)
                                 + octet_length(scope_json) + overhead > max_payload THEN
                PERFORM pg_notify(channel, seal('P', outbox_carrying_pointer(scope_json, first_seq, carried_txid, carried)));
                carried := '';
            END IF;
            IF carried = '' THEN
                carried := written.envelope;
                first_seq := written.seq;
                carried_txid := written.txid;
            ELSE
                carried := carried || ',' || written.envelope;
            END IF;
        END LOOP;
        IF carried <> '' THEN
            PERFORM pg_notify(channel, seal('P', outbox_carrying_pointer(scope_json, first_seq, carried_txid, carried)));
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- For writers that already hold the envelopes (the publish API, the
-- publisher crate's batch emit), so the rows' envelopes are not built a
-- second time in SQL. Called from the same statement as their INSERT, it
-- sends the carrying pointers for that INSERT's rows: `ids`/`seqs` are what
-- the INSERT returned; for each row (by id) the caller gives its scope, the
-- pointer it goes in (`chunks`, numbered in order of the pointers' lowest
-- seqs, each planned by the caller under the same size rules as the
-- trigger's), and its envelope's text before and after the seq. The
-- caller's INSERT sets `announced` on those rows, so the trigger, which
-- fires when the statement ends, leaves them out. In the logical wake-up
-- mode nothing is sent (the trigger is disabled there too). The texts are
-- the caller's, so only the relay's role may call it: an emitting role
-- could announce rows other than its own.
CREATE FUNCTION outbox_announce_rows(
    ids uuid[], seqs bigint[],
    row_ids uuid[], scopes text[], chunks int[], heads text[], tails text[]
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    channel text;
    mode text;
BEGIN
    SELECT s.channel, s.wakeup INTO channel, mode FROM settings s;
    IF NOT FOUND THEN
        -- Raises the error that names the missing setting.
        channel := notify_channel();
    END IF;
    IF mode <> 'notify' THEN
        RETURN;
    END IF;
    PERFORM pg_notify(channel, seal('P', p.payload))
    FROM (
        SELECT r.chunk,
               outbox_carrying_pointer(
                   to_json(min(r.scope))::text, min(w.seq), pg_current_xact_id(),
                   string_agg(r.head || w.seq || r.tail, ',' ORDER BY w.seq)
               ) AS payload
        FROM unnest(ids, seqs) AS w(id, seq)
        JOIN unnest(row_ids, scopes, chunks, heads, tails) AS r(id, scope, chunk, head, tail)
          USING (id)
        GROUP BY r.chunk
        ORDER BY r.chunk
    ) AS p;
END
$$;


-- ---------------------------------------------------------------------------
-- Emitting from SQL
-- ---------------------------------------------------------------------------

-- The emitting functions take their transaction's id before their rows
-- take their seqs. An INSERT takes the seq (the identity's default) before
-- the id (`txid`'s default); taken the other way round, a transaction that
-- holds a lower seq than some webhook delivery's event already had its id
-- when that delivery was written, which ordered delivery relies on (see
-- outbox_enqueue_webhooks). The publish API's statement does the same; a
-- plain INSERT into the outbox keeps the order when its transaction wrote
-- anything before it.

-- Emits a durable event in the caller's transaction and returns its seq:
--   SELECT eventrelay.emit('order.created', 'org-1', '{"orderId": 42}');
-- A rolled-back transaction leaves neither the row nor its wake-up.
CREATE FUNCTION emit(
    event_type  text,
    scope_key   text,
    data        jsonb       DEFAULT '{}'::jsonb,
    audience    jsonb       DEFAULT NULL,
    resources   text[]      DEFAULT '{}',
    id          uuid        DEFAULT NULL,
    occurred_at timestamptz DEFAULT NULL,
    traceparent text        DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pg_current_xact_id();
    INSERT INTO outbox (id, type, scope_key, data, audience, resources, occurred_at, traceparent)
    VALUES (
        coalesce($6, gen_random_uuid()),
        $1,
        $2,
        coalesce($3, '{}'::jsonb),
        CASE WHEN $4 IS NULL OR $4 = 'null'::jsonb OR $4 = '{}'::jsonb THEN NULL ELSE $4 END,
        coalesce($5, '{}'),
        coalesce($7, clock_timestamp()),
        valid_traceparent($8)
    )
    RETURNING seq
$$;

-- Emits many durable events with one statement, in the order given, in
-- the caller's transaction, and returns each one's id and seq: the
-- publisher crate's batch emit. Resource lists are JSON arrays of strings
-- (SQL arrays of arrays must not be ragged). `traceparents` may be NULL or
-- shorter than the rest: the missing ones are NULL. The trigger announces
-- the rows.
CREATE FUNCTION emit_batch(
    ids            uuid[],
    event_types    text[],
    scope_keys     text[],
    datas          jsonb[],
    audiences      jsonb[],
    resource_lists jsonb[],
    occurred_ats   timestamptz[],
    traceparents   text[]        DEFAULT NULL
) RETURNS TABLE (id uuid, seq bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pg_current_xact_id();
    INSERT INTO outbox AS o (id, type, scope_key, data, audience, resources, occurred_at, traceparent)
    SELECT coalesce(e.id, gen_random_uuid()), e.type, e.scope_key, coalesce(e.data, '{}'::jsonb),
           CASE WHEN e.audience IS NULL OR e.audience = 'null'::jsonb OR e.audience = '{}'::jsonb
                THEN NULL ELSE e.audience END,
           ARRAY(SELECT jsonb_array_elements_text(coalesce(e.resources, '[]'::jsonb))),
           coalesce(e.occurred_at, clock_timestamp()), valid_traceparent(e.traceparent)
    FROM unnest($1, $2, $3, $4, $5, $6, $7, $8)
         WITH ORDINALITY AS e(id, type, scope_key, data, audience, resources, occurred_at,
                              traceparent, n)
    ORDER BY e.n
    RETURNING o.id, o.seq
$$;

-- Sends an already encoded ephemeral event (or several sharing one
-- payload), sealed, following the wake-up mode: a notification on the
-- channel, or a transactional logical message whose prefix is the channel
-- (any role may write logical messages, so they are sealed too). Both are
-- delivered at COMMIT and discarded by ROLLBACK. A relay takes nothing but
-- ephemeral events from this path.
CREATE FUNCTION notify_inline(payload text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    channel text := notify_channel();
BEGIN
    IF (SELECT wakeup FROM settings) = 'logical' THEN
        PERFORM pg_logical_emit_message(true, channel, seal('E', payload));
    ELSE
        PERFORM pg_notify(channel, seal('E', payload));
    END IF;
END
$$;


-- ---------------------------------------------------------------------------
-- Disconnecting subscribers
-- ---------------------------------------------------------------------------

-- An operator's disconnection of a subscriber (the admin API writes one
-- per request): every relay reads new rows within a second, ends the
-- subscriber's streams (in `scope_key` only, when set), and refuses new
-- ones until `deny_until`, when set. Relays delete rows a day old whose
-- denial has passed.
CREATE TABLE subscriber_disconnections (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscriber_id text NOT NULL
        CONSTRAINT subscriber_disconnections_subscriber_valid
        CHECK (subscriber_id <> '' AND octet_length(subscriber_id) <= 200),
    scope_key     text
        CONSTRAINT subscriber_disconnections_scope_valid
        CHECK (scope_key IS NULL OR (scope_key <> '' AND octet_length(scope_key) <= 200)),
    deny_until    timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscriber_disconnections_deny_idx ON subscriber_disconnections (deny_until);


-- ---------------------------------------------------------------------------
-- Webhooks
-- ---------------------------------------------------------------------------
--
-- Subscriptions, and deliveries written in the event's own transaction.
-- The deliveries table is also the dispatch queue.

CREATE TABLE webhook_subscriptions (
    id          text PRIMARY KEY
        CONSTRAINT webhook_subscriptions_id_valid CHECK (id ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    url         text NOT NULL
        CONSTRAINT webhook_subscriptions_url_valid CHECK (url ~ '^https?://'),
    -- The signing secret, and the one it replaced while a rotation's grace
    -- window lasts. Never copied into a delivery.
    secret      text NOT NULL CONSTRAINT webhook_subscriptions_secret_not_empty CHECK (secret <> ''),
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    -- Event type patterns: an exact type, `prefix.*`, or `*`.
    types       text[] NOT NULL DEFAULT '{*}'
        CONSTRAINT webhook_subscriptions_types_not_empty CHECK (cardinality(types) > 0),
    -- Only events of this scope, when set.
    scope_key   text,
    -- `config` subscriptions are kept in step with the service configuration.
    source      text NOT NULL DEFAULT 'api'
        CONSTRAINT webhook_subscriptions_source_valid CHECK (source IN ('config', 'api')),
    -- Set while an operator holds the subscription's deliveries back: they
    -- keep being queued and none is attempted until it is cleared.
    paused_at   timestamptz,
    -- `failing` when it paused itself (its attempts all failed for long
    -- enough, often enough); none when an operator paused it.
    paused_reason text,
    -- How its attempts are going, kept as each one settles: since when
    -- every attempt has failed (NULL after a success), and how many have
    -- failed since.
    failing_since  timestamptz,
    failures_since integer NOT NULL DEFAULT 0,
    -- Its pace: at most `max_per_second` attempts a second to its receiver,
    -- whichever relays send them. `paced_until` is its virtual schedule,
    -- the earliest time its next attempt may start: claiming a delivery
    -- moves it on by 1/max_per_second from whichever is later, itself or
    -- now, in the claiming statement, under this row's lock; so claims from
    -- every relay share one schedule, and an idle subscription builds up no
    -- burst. Claims racing for one slot all go (at most one per claiming
    -- worker) and each pushes the schedule on, so the rate over a stretch
    -- of a few steps holds.
    max_per_second integer
        CONSTRAINT webhook_subscriptions_max_per_second_valid
        CHECK (max_per_second IS NULL OR max_per_second BETWEEN 1 AND 100000),
    paced_until timestamptz,
    -- Ordered delivery, opt-in: `scope` orders each scope's events,
    -- `resource` each event's first resource (its scope when it has none).
    -- A key's deliveries go one at a time in seq order (see
    -- webhook_deliveries); one pending longer than `ordering_max_block_secs`,
    -- when set, no longer holds its key back.
    ordering    text NOT NULL DEFAULT 'none'
        CONSTRAINT webhook_subscriptions_ordering_valid
        CHECK (ordering IN ('none', 'scope', 'resource')),
    ordering_max_block_secs integer
        CONSTRAINT webhook_subscriptions_ordering_max_block_valid
        CHECK (ordering_max_block_secs IS NULL OR ordering_max_block_secs > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_subscriptions_paused_reason_valid
        CHECK (paused_reason IS NULL OR (paused_reason = 'failing' AND paused_at IS NOT NULL))
);

CREATE TABLE webhook_deliveries (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- No foreign key: a delivery whose subscription vanished gives up.
    subscription_id   text        NOT NULL,
    event_seq         bigint      NOT NULL,
    event_id          uuid        NOT NULL,
    event_type        text        NOT NULL,
    scope_key         text        NOT NULL,
    -- The body to send: the envelope without its audience. Kept here so a
    -- delivery outlives the outbox row's retention.
    payload           jsonb       NOT NULL,
    -- pending: waiting for an attempt; delivered: a 2xx; dead: the retry
    -- schedule ran out; gone: 410, or the subscription no longer exists.
    status            text        NOT NULL DEFAULT 'pending'
        CONSTRAINT webhook_deliveries_status_valid CHECK (status IN ('pending', 'delivered', 'dead', 'gone')),
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz,
    last_status       integer,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- The key an ordered subscription's delivery goes in order within;
    -- NULL for an unordered one, and for a redelivery, which is sent on its
    -- own, outside its key's order.
    ordering_key      text,
    -- The first transaction id not yet handed out when the delivery was
    -- written: once no transaction below it is running, no lower seq of its
    -- key can still commit (see outbox_enqueue_webhooks).
    ordered_after     xid8,
    -- Claimed while an older delivery of its key was still pending, past
    -- the subscription's ordering_max_block_secs.
    order_skipped     boolean     NOT NULL DEFAULT false,
    -- The event's trace context, sent on each attempt as `traceparent`
    -- (the body leaves it out).
    traceparent       text
);

-- Claiming due work: among deliveries due together, the oldest events
-- first, so each key's head comes before the rest of its key.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at, event_seq)
    WHERE status = 'pending';
-- A key's pending deliveries by seq: which one is the key's head.
CREATE INDEX webhook_deliveries_ordering_idx
    ON webhook_deliveries (subscription_id, ordering_key, event_seq)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;
-- Listing the log.
CREATE INDEX webhook_deliveries_scope_idx ON webhook_deliveries (scope_key, id);
CREATE INDEX webhook_deliveries_status_idx ON webhook_deliveries (status, id);
CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);
CREATE INDEX webhook_deliveries_subscription_idx ON webhook_deliveries (subscription_id, id);
-- Pruning finished deliveries by age.
CREATE INDEX webhook_deliveries_finished_idx ON webhook_deliveries (updated_at) WHERE status <> 'pending';

CREATE TABLE webhook_attempts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id    bigint      NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt        integer     NOT NULL,
    started_at     timestamptz NOT NULL,
    duration_ms    integer     NOT NULL,
    status_code    integer,
    error          text,
    -- The start of the receiver's answer (at most 1 KiB), for an operator
    -- asking why it failed.
    response       text,
    outcome        text        NOT NULL
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id, attempt);
-- A subscription's recent failures, for its health.
CREATE INDEX webhook_attempts_started_idx ON webhook_attempts (started_at);

-- Whether a subscription's patterns take an event type.
CREATE FUNCTION webhook_type_matches(patterns text[], event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM unnest(patterns) AS p
        WHERE p = '*'
           OR p = event_type
           OR (right(p, 2) = '.*' AND starts_with(event_type, left(p, -1)))
    )
$$;

-- Every durable event writes one delivery per matching subscription, in
-- the event's own transaction: a rolled-back write leaves neither. Runs
-- once per INSERT statement, and returns at once while there is no
-- subscription at all, so a schema without webhooks pays next to nothing.
--
-- Webhook workers are woken only by transactions that queued deliveries:
-- in the notify wake-up mode this sends `{"k":"due"}` on the channel for
-- each statement that queued any. It keeps no mark to send one per
-- transaction, since any session may set any setting: an emitter could
-- set it to keep its deliveries from waking the workers. In the logical
-- mode the relays see the delivery rows in the stream.
CREATE FUNCTION outbox_enqueue_webhooks() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions) THEN
        RETURN NULL;
    END IF;
    -- An ordered subscription's delivery records its key, and the first
    -- transaction id not yet handed out now, after the rows were written:
    -- every transaction that took a lower seq held its id before (see
    -- above), so once none below this one is running, no lower seq of the
    -- key can still commit.
    INSERT INTO webhook_deliveries
        (subscription_id, event_seq, event_id, event_type, scope_key, payload,
         ordering_key, ordered_after, traceparent)
    SELECT s.id, n.seq, n.id, n.type, n.scope_key,
           outbox_envelope(n)::jsonb - 'audience' - 'traceparent',
           CASE s.ordering
               WHEN 'scope' THEN 's:' || n.scope_key
               WHEN 'resource' THEN coalesce('r:' || n.resources[1], 's:' || n.scope_key)
           END,
           CASE WHEN s.ordering <> 'none' THEN pg_snapshot_xmax(pg_current_snapshot()) END,
           n.traceparent
    FROM new_rows n
    JOIN webhook_subscriptions s
      ON (s.scope_key IS NULL OR s.scope_key = n.scope_key)
     AND webhook_type_matches(s.types, n.type)
    ORDER BY n.seq, s.id;
    -- Sealed, no two `due` payloads are equal, so Postgres does not fold a
    -- transaction's into one; the dispatcher folds the wake-ups instead.
    IF FOUND AND (SELECT wakeup FROM settings) = 'notify' THEN
        PERFORM pg_notify(notify_channel(), seal('P', '{"k":"due"}'));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_enqueue_webhooks AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_enqueue_webhooks();


-- ---------------------------------------------------------------------------
-- The customer portal
-- ---------------------------------------------------------------------------
--
-- A portal session lets one of the application's customers (one scope)
-- manage that scope's webhook subscriptions from a page the relay serves.
-- The application mints a session (portal_session(), or the admin API,
-- which calls it) and hands the customer's browser a one-time code; the
-- page exchanges the code with a relay for a bearer token. Only hashes
-- are stored: a copy of this table lets no one in.
CREATE TABLE portal_sessions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope_key       text NOT NULL
        CONSTRAINT portal_sessions_scope_valid
        CHECK (scope_key <> '' AND octet_length(scope_key) <= 200),
    -- SHA-256 of the one-time code, cleared when it is exchanged.
    code_hash       bytea UNIQUE,
    code_expires_at timestamptz NOT NULL,
    -- SHA-256 of the bearer token the code was exchanged for.
    token_hash      bytea UNIQUE,
    expires_at      timestamptz NOT NULL,
    -- CSS variables for the page: `accent` (a hex colour) and `font` (a
    -- font-family list), nothing else, so no value can carry CSS of its own.
    theme           jsonb
        CONSTRAINT portal_sessions_theme_valid
        CHECK (theme IS NULL OR (
            jsonb_typeof(theme) = 'object'
            AND theme - 'accent' - 'font' = '{}'::jsonb
            AND (NOT theme ? 'accent' OR theme ->> 'accent' ~ '^#([0-9A-Fa-f]{3}|[0-9A-Fa-f]{6})$')
            AND (NOT theme ? 'font' OR theme ->> 'font' ~ '^[A-Za-z0-9 ,''"-]{1,100}$')
        )),
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- Pruning by age.
CREATE INDEX portal_sessions_expires_idx ON portal_sessions (expires_at);

-- Mints a portal session for `scope_key`, lasting `expires_in_secs` (at
-- most a week), and returns its one-time code, which is good for five
-- minutes or the session's life if shorter. The code is 244 random bits
-- from two gen_random_uuid() (the server's strong random source).
CREATE FUNCTION portal_session(
    scope_key       text,
    expires_in_secs integer,
    theme           jsonb DEFAULT NULL
) RETURNS TABLE (code text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    minted text := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    ends timestamptz;
BEGIN
    IF expires_in_secs IS NULL OR expires_in_secs < 1 OR expires_in_secs > 604800 THEN
        RAISE EXCEPTION 'expires_in_secs must be from 1 to 604800 (a week), not %', expires_in_secs
            USING ERRCODE = '22023';
    END IF;
    ends := now() + make_interval(secs => expires_in_secs);
    INSERT INTO portal_sessions (scope_key, code_hash, code_expires_at, expires_at, theme)
    VALUES ($1, sha256(convert_to(minted, 'UTF8')), least(now() + interval '5 minutes', ends),
            ends, $3);
    RETURN QUERY SELECT minted, ends;
END
$$;


-- ---------------------------------------------------------------------------
-- Presence
-- ---------------------------------------------------------------------------
--
-- Who is connected to the scopes `presence.scopes` names, across relays.
-- Each relay writes a row per subscriber it holds streams of (their count,
-- and the token's `presence_info`), and a heartbeat; every relay reads the
-- rows changed since the last version it saw, every `presence.batch_ms`.
-- A subscriber that leaves a relay keeps its row with `streams = 0` (a
-- tombstone) for a while, so the others read the leave too. A relay whose
-- heartbeat is older than `presence.expire_secs` is dead to the others, and
-- so are its rows.
CREATE TABLE presence_relays (
    relay_id     text PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL
);
CREATE SEQUENCE presence_version;
CREATE TABLE presence_members (
    relay_id      text        NOT NULL,
    scope_key     text        NOT NULL,
    subscriber_id text        NOT NULL,
    streams       integer     NOT NULL CHECK (streams >= 0),
    info          jsonb,
    version       bigint      NOT NULL DEFAULT nextval('presence_version'),
    -- The transaction that last wrote the row. A version is taken when the
    -- row is written, not when it commits, so a lower one can become
    -- visible after a higher one was read: each read also takes the rows of
    -- every transaction that was still running at the read before it.
    txid          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    changed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope_key, subscriber_id, relay_id)
);
-- Reading what changed since a version, and what late commits wrote.
CREATE INDEX presence_members_version_idx ON presence_members (version);
CREATE INDEX presence_members_txid_idx ON presence_members (txid);
CREATE INDEX presence_members_relay_idx ON presence_members (relay_id);
