/** An eventrelay event as it arrives (see schema/event-envelope.schema.json). */
export interface EventEnvelope<Data = unknown> {
  id: string;
  type: string;
  scopeKey: string;
  lane: 'durable' | 'ephemeral';
  /** Present on durable events only. */
  seq?: number;
  data: Data;
  resources: string[];
  occurredAt: string;
}

/** A member of a scope with presence: a subscriber with at least one open stream. */
export interface PresenceMember {
  id: string;
  /** Its open streams, on every relay together (two tabs that do not share: 2). */
  streams: number;
  /** The `presence_info` its token carries (a display name, an avatar URL), when it carries one. */
  info?: Record<string, unknown>;
}

/**
 * Who is connected to one of the stream's scopes, from the relay's
 * `presence` frames. A new object whenever it changes (a member that did
 * not change keeps its object); treat it, and its map, as read-only.
 */
export interface Presence {
  /** The scope these members are connected to (each scope of a stream has its own list). */
  scopeKey: string;
  /** The number of members: exact, also when `countsOnly`. */
  count: number;
  /**
   * The scope is past the relay's `presence.max_members`: `members` is empty
   * and only `count` is known, until a snapshot (the next connection) lists
   * everyone again.
   */
  countsOnly: boolean;
  /** The members by id (subscribers with `presence: false` are never listed). */
  members: ReadonlyMap<string, PresenceMember>;
}

/** What one presence frame changed in `Presence.members`. */
export interface PresenceChange {
  /** The frame was a snapshot (the first of a connection, or one passed on to a tab that joined): it replaced the list. */
  snapshot: boolean;
  /** Members that were not in the list before. */
  joined: PresenceMember[];
  /** Members whose stream count or info changed. */
  updated: PresenceMember[];
  /** Members no longer in the list, as they were (also those a scope past the cap no longer lists). */
  left: PresenceMember[];
}

export type ConnectionState = 'connecting' | 'connected' | 'reconnecting' | 'degraded' | 'stopped';

export interface StreamRequest {
  url: string;
  headers?: Record<string, string>;
}

interface CommonOptions {
  /**
   * The scopes the stream carries (scope keys): one `scope` query parameter
   * each, sorted and without repeats, in place of any `scope` parameter the
   * URL has, so the same set in any order opens (and, between tabs, shares)
   * the same stream. The credentials must grant every one (else the relay
   * answers 403, `unauthorized`), and the relay caps how many one stream
   * carries (`sse.max_scopes_per_stream`, 16 by default; more are answered
   * 400, `http_status`). Without it the stream carries every scope the
   * credentials grant, up to that cap. A stream of several scopes interleaves
   * their events (`EventEnvelope.scopeKey` tells them apart), resyncs them
   * one by one (`onResync(scope)`), keeps a member list for each one with
   * presence (`client.presenceOf(scope)`), and loses one alone when an
   * operator takes it out (`onError` with `code` `revoked` and `scope`).
   * Must be a non-empty array of non-empty strings: anything else throws a
   * TypeError at creation.
   */
  scopes?: string[];
  /**
   * Resolves to a fresh bearer token, sent as `Authorization: Bearer <token>`
   * (in place of any the request has). Called at the start, when the relay
   * refuses a token (401 or 403: once per stream that reaches `ready`, the
   * retry going at once), and when the relay warns that the stream's token
   * is about to expire (`event: reauth`): the client then opens the next
   * stream with the new token and the watermark while the old one still
   * delivers, and closes the old one once the new one is `ready`, so no
   * event is missed and none reaches `onEvent` twice. Between those calls
   * the token is reused for reconnects. With tabs sharing a stream, only the
   * tab holding the connection renews. A rejection counts as a failed
   * attempt (retried with backoff).
   */
  getToken?: () => Promise<string>;
  onEvent?: (event: EventEnvelope) => void;
  onStateChange?: (state: ConnectionState) => void;
  /**
   * Events may have been missed: re-read what the page shows. On a stream
   * of one scope it is called without an argument: re-read everything. On a
   * stream of several scopes it is called once for each scope to re-read,
   * with its key (`onResync('doc-7')`), and only for those: the relay's
   * `ready` names them. When that `ready` cannot be read, it is called for
   * each scope (asked for in `scopes`), or once without an argument when
   * the client does not know them. A tab that joins a stream another tab
   * holds re-reads every scope once, as the relay cannot replay to it what
   * went by before it listened.
   */
  onResync?: (scope?: string) => void;
  /**
   * In a scope with presence (`presence.scopes`): who is connected changed.
   * Called at the first snapshot, then whenever the members or the count
   * change, for each scope of the stream on its own (`presence.scopeKey`
   * says which). `presence` is also `client.presenceOf(presence.scopeKey)`
   * (and `client.presence` on a stream of one scope). Presence frames never
   * reach `onEvent` and never move `lastEventId`.
   */
  onPresence?: (presence: Presence, change: PresenceChange) => void;
  /**
   * 401/403 (after `getToken`, if given, had its try): return true after
   * refreshing credentials to retry; otherwise the client stops.
   */
  onUnauthorized?: (status: number) => boolean | Promise<boolean>;
  /**
   * The client stopped on refused credentials (`code` `unauthorized`),
   * dropped a frame it must not deliver (`reserved_event_type`,
   * `malformed_ready`, `malformed_presence`), or an operator disconnected
   * the subscriber (`revoked`). A `revoked` error with a `scope` means that
   * scope alone was taken out of a stream of several: the stream goes on
   * with the others, without reconnecting, and the scope leaves
   * `client.scopes` (a later reconnect asks for it again; if the relay
   * refuses that, create the client again without it). A `malformed_ready` about a stream of several scopes whose
   * lists are unreadable still connects, and re-reads every scope. Without
   * this hook, all but `unauthorized` go to `console.warn`.
   */
  onError?: (error: EventRelayError | Error) => void;
  /** Resume after this seq (a watermark saved earlier). */
  lastEventId?: string;
  /** Backoff base, replaced by the relay's `retry:`. Default 1000. */
  initialDelayMs?: number;
  /** Backoff ceiling. Default 30000. */
  maxDelayMs?: number;
  /**
   * Longest wait a 429 or 503 answer's `Retry-After` can ask for; a longer
   * one is cut to this. Default 300000 (5 minutes).
   */
  maxRetryAfterMs?: number;
  /**
   * Failed attempts in a row (a refusal, a network error, a stream that ends
   * before `ready`, a body that errors) before the state becomes `degraded`;
   * `ready` resets the count. Default 3.
   */
  degradedAfter?: number;
  /** How many event ids are remembered for de-duplication. */
  seenCapacity?: number;
  /**
   * Tabs of one origin that open the same stream share one connection: one
   * tab holds it (a Web Lock) and passes events, the watermark, state
   * changes, resyncs and presence to the others (a BroadcastChannel); when
   * it closes, another takes over from the shared watermark. Default true where
   * `navigator.locks` and `BroadcastChannel` exist, except under Node; false
   * forces a connection of this client's own.
   */
  shareAcrossTabs?: boolean;
  /**
   * The name tabs meet under (the lock and the channel are named
   * `eventrelay-v3:<shareName>`). Default: a digest of the request's absolute
   * URL (with the `scope` parameters from `scopes`, so tabs share by the set
   * of scopes) and headers, with a JWT bearer token reduced to its claims
   * without `exp`, `iat`, `nbf` and `jti`, so tabs holding different tokens
   * for the same subscriber still share. Set it when a header differs per
   * tab.
   */
  shareName?: string;
}

export type ClientOptions = CommonOptions &
  (
    | {
        /** Called on every connect, so credentials are always fresh. */
        buildRequest: () => StreamRequest | Promise<StreamRequest>;
        url?: never;
      }
    | {
        /** The stream's URL, for a request with nothing to build but the token from `getToken`. */
        url: string;
        buildRequest?: never;
      }
  );

export interface EventStreamClient {
  start(): void;
  stop(): void;
  readonly state: ConnectionState;
  /** The last durable `id:` seen by this tab or, when sharing, the tab holding the connection: the replay watermark. */
  readonly lastEventId: string | undefined;
  /** True while this client holds the connection (always, once started, when it does not share). */
  readonly isLeader: boolean;
  /**
   * Who is connected to the stream's scope, once the relay sent a presence
   * snapshot (with tabs sharing a stream, passed on by the tab holding it).
   * Undefined in a scope without presence, before the snapshot, after
   * `stop()`, and on a stream of several scopes (see `presenceOf`). Kept
   * through a reconnect until the next snapshot replaces it.
   */
  readonly presence: Presence | undefined;
  /**
   * Who is connected to `scope`, one of the stream's scopes, as `presence`
   * is for a stream of one: undefined in a scope without presence, before
   * its snapshot, after `stop()`, and once the scope left the stream.
   */
  presenceOf(scope: string): Presence | undefined;
  /**
   * The scopes the stream carries (sorted), as the relay's last `ready`
   * named them, less any an operator took out since. The relay names them
   * on a stream of several scopes; on a stream of one this is the one
   * asked for in `scopes`, or undefined when the stream was opened without
   * `scopes` (it carries the scope of the credentials). Undefined before
   * the first `ready` and after `stop()`.
   */
  readonly scopes: readonly string[] | undefined;
}

export function createEventStreamClient(options: ClientOptions): EventStreamClient;

export type EventRelayErrorCode =
  | 'unauthorized'
  | 'http_status'
  | 'ended_early'
  | 'not_event_stream'
  | 'malformed_ready'
  | 'malformed_presence'
  | 'reserved_event_type'
  | 'revoked';

/** What the client reports; `code` keeps its meaning across versions. */
export class EventRelayError extends Error {
  constructor(
    code: EventRelayErrorCode,
    message: string,
    details?: { status?: number; retryAfterMs?: number; eventType?: string; scope?: string },
  );
  readonly code: EventRelayErrorCode;
  /** The HTTP status, for `unauthorized` and `http_status`. */
  readonly status?: number;
  /** How long a 429 or 503 asked the client to wait. */
  readonly retryAfterMs?: number;
  /** The dropped frame's type, for `reserved_event_type`. */
  readonly eventType?: string;
  /** For `revoked`: the one scope taken out of a stream of several, which goes on with the others. */
  readonly scope?: string;
}

/** `ready`, `open`, `error`, `reauth`, `revoked`, `presence` and every type starting with `eventrelay.` but the relay's own events (`eventrelay.subscription.paused`): never handed to the application. */
export function isReservedEventType(type: string): boolean;

/** A `Retry-After` value (seconds or an HTTP date) as milliseconds from `now`; undefined when unreadable. */
export function parseRetryAfter(value: string | undefined, now?: number): number | undefined;

/** The default `shareName` for a request. */
export function deriveShareName(request: StreamRequest): Promise<string>;

export interface SseFrame {
  /** The last `id:` seen on the stream (kept across frames). */
  id: string | undefined;
  /** True when this frame had an `id:` line of its own. */
  ownId: boolean;
  event: string;
  data: string;
}

/** The stream parser, exported for reuse and tests. */
export class SseParser {
  constructor(onEvent: (frame: SseFrame) => void, onRetry?: (ms: number) => void);
  push(chunk: Uint8Array | string): void;
}
