// eventrelay browser client: reads the relay's Server-Sent Events stream with
// fetch (so it can send an Authorization header, which EventSource cannot),
// replays from a durable-only watermark, reconnects with full-jitter backoff,
// and de-duplicates at-least-once delivery by envelope id. Given `getToken`,
// it renews an expiring token without a gap: warned by the relay, it opens
// the next stream with a fresh token before the old one ends. One stream
// may carry several scopes (`scopes`); the client then tells which of them
// to re-read. In a scope with presence, it keeps the scope's member list
// from the relay's `presence` frames. In a browser, the tabs of one origin
// share one connection: one tab holds it (a Web Lock) and passes what
// arrives to the others (a BroadcastChannel). No dependencies; runs in
// browsers, workers and Node 20+.

/** @typedef {'connecting'|'connected'|'reconnecting'|'degraded'|'stopped'} ConnectionState */

const DEFAULTS = {
  initialDelayMs: 1000,
  maxDelayMs: 30000,
  maxRetryAfterMs: 300000,
  degradedAfter: 3,
  seenCapacity: 1000,
};

// Part of every lock and channel name, so that tabs running different
// versions of this client (an old tab next to a reloaded one) never mix
// messages they do not both understand. v2: presence, which a v1 tab
// holding the connection would pass on as an event. v3: several scopes
// per stream, whose resyncs, revocations and member lists a v2 tab would
// take for the stream's one scope.
const SHARE_PREFIX = 'eventrelay-v3:';

// The states a tab takes over from the one holding the connection (which
// never announces `stopped`: another tab takes over instead).
const FOLLOWED_STATES = new Set(['connecting', 'reconnecting', 'degraded']);

// Names the relay refuses for application events: `ready`, `reauth`,
// `revoked` and `presence` are its control frames, `open` and `error` are
// what EventSource raises for the connection itself, and the prefix is the
// relay's: for future control frames, and for the events it writes itself
// about itself (SYSTEM_EVENT_TYPES), which streams carry like any event.
const RESERVED_EVENT_TYPES = new Set(['ready', 'open', 'error', 'reauth', 'revoked', 'presence']);
const RESERVED_EVENT_TYPE_PREFIX = 'eventrelay.';
const SYSTEM_EVENT_TYPES = new Set(['eventrelay.subscription.paused']);

/** True for event types a stream never hands to the application. */
export function isReservedEventType(type) {
  return typeof type === 'string'
    && !SYSTEM_EVENT_TYPES.has(type)
    && (RESERVED_EVENT_TYPES.has(type) || type.startsWith(RESERVED_EVENT_TYPE_PREFIX));
}

/**
 * What the client reports through `onError`, and why an attempt failed.
 * `code` keeps its meaning across versions: `unauthorized` (with `status`),
 * `http_status` (with `status`, and `retryAfterMs` when the relay sent a
 * usable Retry-After), `ended_early`, `not_event_stream`, `malformed_ready`,
 * `malformed_presence`, `reserved_event_type` (with `eventType`), `revoked`
 * (with `scope` when the relay took one scope out of a stream of several).
 */
export class EventRelayError extends Error {
  constructor(code, message, details = {}) {
    super(message);
    this.name = 'EventRelayError';
    this.code = code;
    Object.assign(this, details);
  }
}

/**
 * Splits a byte stream into SSE events following the WHATWG EventSource
 * parsing rules: CRLF, CR and LF line ends (also across chunks), a leading
 * BOM, comments, `field: value` with one optional space, multi-line data.
 */
export class SseParser {
  constructor(onEvent, onRetry = () => {}) {
    this.onEvent = onEvent;
    this.onRetry = onRetry;
    this.decoder = new TextDecoder('utf-8');
    this.buffer = '';
    this.sawCR = false;
    this.first = true;
    this.id = undefined;
    this.reset();
  }

  // The id buffer is not reset between events: per the EventSource rules a
  // frame without `id:` keeps the last one. `ownId` says whether the frame
  // being read set it itself, which is what tells a control frame (never
  // has one) from a durable application event (always has one).
  reset() {
    this.data = [];
    this.eventType = '';
    this.ownId = false;
  }

  /** @param {Uint8Array|string} chunk */
  push(chunk) {
    let text = typeof chunk === 'string' ? chunk : this.decoder.decode(chunk, { stream: true });
    if (this.first && text.length > 0) {
      this.first = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (this.sawCR) {
        this.sawCR = false;
        if (c === '\n') {
          start = i + 1;
          continue;
        }
      }
      if (c === '\r' || c === '\n') {
        this.line(this.buffer + text.slice(start, i));
        this.buffer = '';
        start = i + 1;
        if (c === '\r') this.sawCR = true;
      }
    }
    this.buffer += text.slice(start);
  }

  line(line) {
    if (line === '') {
      if (this.data.length > 0) {
        this.onEvent({ id: this.id, ownId: this.ownId, event: this.eventType || 'message', data: this.data.join('\n') });
      }
      this.reset();
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'data':
        this.data.push(value);
        break;
      case 'event':
        this.eventType = value;
        break;
      case 'id':
        if (!value.includes('\0')) {
          this.id = value;
          this.ownId = true;
        }
        break;
      case 'retry':
        if (/^[0-9]+$/.test(value)) this.onRetry(Number(value));
        break;
      default:
        break;
    }
  }
}

/** Remembers the last `capacity` ids, forgetting the oldest first. */
class SeenIds {
  constructor(capacity) {
    this.capacity = capacity;
    this.ids = new Set();
  }

  /** @returns {boolean} true the first time an id is seen */
  add(id) {
    if (this.ids.has(id)) return false;
    this.ids.add(id);
    if (this.ids.size > this.capacity) {
      this.ids.delete(this.ids.values().next().value);
    }
    return true;
  }
}

/**
 * A `Retry-After` value in milliseconds from now: delay-seconds or an
 * HTTP date. Undefined when it is missing or unreadable.
 */
export function parseRetryAfter(value, now = Date.now()) {
  if (typeof value !== 'string') return undefined;
  const text = value.trim();
  if (/^[0-9]+$/.test(text)) return Number(text) * 1000;
  // Every HTTP date format starts with a day name; without this check
  // Date.parse would also take things like "-5".
  if (!/^[A-Za-z]{3,9},? /.test(text)) return undefined;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

function refusal(response) {
  const { status } = response;
  if (status === 401 || status === 403) {
    return new EventRelayError('unauthorized', `the relay refused the credentials (${status})`, { status });
  }
  // Only these two mean "come back later"; elsewhere the header is ignored.
  const retryAfter = status === 429 || status === 503 ? response.headers.get('retry-after') : null;
  const retryAfterMs = parseRetryAfter(retryAfter ?? undefined);
  return new EventRelayError('http_status', `the relay answered ${status}`, { status, retryAfterMs });
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

const isObject = (value) => typeof value === 'object' && value !== null && !Array.isArray(value);

const delay = (ms, signal) =>
  new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });

/** Web Locks and BroadcastChannel are both needed to share a stream. */
function canShare() {
  return typeof BroadcastChannel === 'function' && typeof globalThis.navigator?.locks?.request === 'function';
}

// Node has no tabs: a process there connects on its own unless asked to share.
const isNode = typeof globalThis.process?.versions?.node === 'string';

function decodeBase64Url(text) {
  const base64 = text.replaceAll('-', '+').replaceAll('_', '/').padEnd(Math.ceil(text.length / 4) * 4, '=');
  return new TextDecoder().decode(Uint8Array.from(atob(base64), (c) => c.charCodeAt(0)));
}

/** JSON with object keys sorted, so equal claims always read the same. */
function canonicalJson(value) {
  const sort = (v) =>
    Array.isArray(v) ? v.map(sort) : isObject(v) ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])])) : v;
  return JSON.stringify(sort(value));
}

const isScopeList = (list) => Array.isArray(list) && list.every((key) => typeof key === 'string' && key !== '');

/**
 * The `scopes` option as the stream's query asks for them: sorted and
 * without repeats, so that the same set in any order makes the same URL,
 * and with it the same stream to share between tabs.
 */
function requestedScopes(scopes) {
  if (scopes === undefined) return undefined;
  if (!isScopeList(scopes) || scopes.length === 0) {
    throw new TypeError('`scopes` must be a non-empty array of non-empty strings (scope keys)');
  }
  return Object.freeze([...new Set(scopes)].sort());
}

// A query parameter's name as a server reads it (`+` is a space there).
function parameterName(pair) {
  const name = pair.split('=', 1)[0].replaceAll('+', ' ');
  try {
    return decodeURIComponent(name);
  } catch {
    return name;
  }
}

/**
 * `url` (absolute or not) with one `scope` parameter per scope in place of
 * any it had. Only the query is touched, and the rest of it as written, so
 * that a URL without `scopes` reaches the relay as the application gave it.
 */
function withScopes(url, scopes) {
  const hash = url.indexOf('#');
  const fragment = hash === -1 ? '' : url.slice(hash);
  const rest = hash === -1 ? url : url.slice(0, hash);
  const question = rest.indexOf('?');
  const path = question === -1 ? rest : rest.slice(0, question);
  const query = question === -1 ? [] : rest.slice(question + 1).split('&');
  const kept = query.filter((pair) => pair !== '' && parameterName(pair) !== 'scope');
  const added = scopes.map((scope) => `scope=${encodeURIComponent(scope)}`);
  return `${path}?${[...kept, ...added].join('&')}${fragment}`;
}

/**
 * What a `ready` frame says, or undefined when it is none (no boolean
 * `resync`). A stream of one scope says only `resync`. A stream of several
 * (`multi`) also names its `scopes` and the ones to re-read, and `resync`
 * is then that list. One whose lists are unreadable or disagree with
 * `resync` is `malformed`, and everything it carries is re-read (`resync`
 * true): re-reading too much costs a request, missing one leaves a page
 * wrong without a sign.
 */
function readReady(data) {
  if (!isObject(data) || typeof data.resync !== 'boolean') return undefined;
  if (data.scopes === undefined && data.resyncScopes === undefined) {
    return { multi: false, scopes: undefined, resync: data.resync };
  }
  const scopes = isScopeList(data.scopes) && data.scopes.length > 0 ? [...new Set(data.scopes)] : undefined;
  const listed = isScopeList(data.resyncScopes) ? [...new Set(data.resyncScopes)] : undefined;
  if (scopes && listed && listed.every((key) => scopes.includes(key)) && data.resync === listed.length > 0) {
    return { multi: true, scopes, resync: listed };
  }
  return { multi: true, scopes, resync: true, malformed: true };
}

// A member: its id, its open streams on every relay together, and the
// `info` its token carries, when it carries one. The presence: the scope,
// the member count, and the members by id (empty, with `countsOnly`, past
// the relay's cap, where only the count is known).
/** @typedef {{id: string, streams: number, info?: object}} PresenceMember */
/** @typedef {{scopeKey: string, count: number, countsOnly: boolean, members: Map<string, PresenceMember>}} Presence */

const isMember = (m) => isObject(m) && typeof m.id === 'string' && Number.isInteger(m.streams);
const isIdList = (list) => Array.isArray(list) && list.every((id) => typeof id === 'string');

/**
 * A presence frame's data when it has the shape the relay writes, else
 * undefined. Frames from other tabs pass through here too: a tab of
 * another page of the origin could post anything.
 */
function readPresenceFrame(data) {
  if (!isObject(data) || typeof data.snapshot !== 'boolean' || typeof data.scopeKey !== 'string') return undefined;
  if (!Number.isInteger(data.count) || data.count < 0) return undefined;
  // Past the relay's cap there is no member list, only the count (and a
  // snapshot's `left` may still be an empty list).
  if (data.members === null) return data.left === null || isIdList(data.left) ? data : undefined;
  return Array.isArray(data.members) && data.members.every(isMember) && isIdList(data.left) ? data : undefined;
}

const sameMember = (a, b) => a.streams === b.streams && canonicalJson(a.info ?? null) === canonicalJson(b.info ?? null);

/**
 * The presence after `frame`, and what it changed: the members added to,
 * changed in and removed from the list. Undefined for a change that has no
 * snapshot to apply to. A snapshot replaces the list; the state and its
 * members are new objects whenever they change (a member that did not
 * change keeps its object), so the application may keep references.
 */
function applyPresence(previous, frame) {
  if (!frame.snapshot && previous === undefined) return undefined;
  const before = previous?.members ?? new Map();
  // Once a scope is past the cap, its changes name only who moved, never
  // everyone there: the list stays empty until a snapshot lists everyone.
  const countsOnly = frame.members === null || (!frame.snapshot && previous.countsOnly);
  let listed = [];
  if (!countsOnly) {
    const after = frame.snapshot ? new Map() : new Map(before);
    for (const m of frame.members) after.set(m.id, m);
    if (!frame.snapshot) for (const id of frame.left) after.delete(id);
    listed = [...after.values()];
  }
  const members = new Map();
  const change = { snapshot: frame.snapshot, joined: [], updated: [], left: [] };
  for (const m of listed) {
    const was = before.get(m.id);
    if (was && sameMember(was, m)) {
      members.set(m.id, was);
      continue;
    }
    const member = Object.freeze({ id: m.id, streams: m.streams, ...(m.info == null ? {} : { info: m.info }) });
    members.set(m.id, member);
    (was ? change.updated : change.joined).push(member);
  }
  for (const [id, member] of before) if (!members.has(id)) change.left.push(member);
  const changed =
    previous === undefined ||
    change.joined.length + change.updated.length + change.left.length > 0 ||
    frame.count !== previous.count ||
    countsOnly !== previous.countsOnly ||
    frame.scopeKey !== previous.scopeKey;
  if (!changed) return { presence: previous, change: undefined };
  const presence = Object.freeze({ scopeKey: frame.scopeKey, count: frame.count, countsOnly, members });
  return { presence, change: Object.freeze(change) };
}

/** A snapshot frame of `presence`: what the tab holding the connection tells a tab that joins. */
function presenceSnapshot(presence) {
  const members = presence.countsOnly ? null : [...presence.members.values()];
  return { scopeKey: presence.scopeKey, snapshot: true, count: presence.count, members, left: presence.countsOnly ? null : [] };
}

// Tabs usually hold different tokens for the same subscriber (each fetched
// its own, with its own expiry), so a JWT is identified by its claims minus
// the time-dependent ones: those tabs still share. Anything else counts as
// written. Nothing is verified here; the relay checks whichever token the
// connected tab sends.
function credentialIdentity(value) {
  const match = /^bearer\s+([\w-]+)\.([\w-]+)\.([\w-]*)$/i.exec(value.trim());
  if (!match) return value;
  try {
    const claims = JSON.parse(decodeBase64Url(match[2]));
    if (!isObject(claims)) return value;
    for (const claim of ['exp', 'iat', 'nbf', 'jti']) delete claims[claim];
    return `jwt ${canonicalJson(claims)}`;
  } catch {
    return value;
  }
}

/**
 * The name tabs meet under: a digest of the stream's absolute URL and its
 * request headers (credentials by identity), so only tabs that would get
 * the same stream share one. Hashed, so no credential shows in lock names.
 */
export async function deriveShareName(request) {
  const url = new URL(request.url, globalThis.location?.href).href;
  const headers = [];
  for (const [name, value] of new Headers(request.headers ?? {})) {
    headers.push([name, name === 'authorization' ? credentialIdentity(value) : value]);
  }
  const bytes = new TextEncoder().encode(JSON.stringify([url, headers]));
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return [...digest.slice(0, 16)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * Creates a client. Call `start()` to connect and `stop()` to end.
 * @param {import('./eventrelay-client').ClientOptions} options
 */
export function createEventStreamClient(options) {
  const settings = { ...DEFAULTS, ...options };
  if (typeof settings.buildRequest !== 'function' && typeof settings.url !== 'string') {
    throw new TypeError('createEventStreamClient needs `buildRequest` or `url`');
  }
  const requested = requestedScopes(settings.scopes);
  const sharing = (settings.shareAcrossTabs ?? !isNode) && canShare();
  const seen = new SeenIds(settings.seenCapacity);
  let state = 'stopped';
  let lastEventId = settings.lastEventId;
  /** @type {Map<string, Presence>} each scope's members, once a snapshot arrived */
  const presences = new Map();
  /** @type {readonly string[]|undefined} the scopes the stream carries, from the last `ready` */
  let carried;
  // The last `ready` named several scopes: resyncs and presence go by scope.
  let multi = false;
  // One run, from start() to stop(). Everything asynchronous checks that its
  // run is still active, so a stop() followed by a start() can never let
  // the old run call the application or touch the new one.
  let session;

  // Application callbacks run isolated: one that throws is reported as an
  // uncaught error (reportError in browsers) but never tears down a
  // connection other tabs depend on.
  const call = (callback, ...args) => {
    if (!callback) return;
    try {
      callback(...args);
    } catch (error) {
      if (typeof globalThis.reportError === 'function') globalThis.reportError(error);
      else
        queueMicrotask(() => {
          throw error;
        });
    }
  };

  const report = (error) => {
    if (settings.onError) call(settings.onError, error);
    else globalThis.console?.warn?.(`eventrelay: ${error.message}`);
  };

  const post = (s, message) => {
    if (!s.active || !s.channel) return;
    try {
      s.channel.postMessage(message);
    } catch {
      // Not clonable or the channel is closed: the other tabs resync later.
    }
  };

  /** Sets the state; the tab holding the connection tells the others. */
  const setState = (s, next, extra = {}) => {
    if (!s.active) return;
    if (next !== state) {
      state = next;
      call(settings.onStateChange, next);
    }
    if (s.leader) post(s, { kind: 'state', state: next, lastEventId, multi, scopes: carried, ...extra });
  };

  /**
   * The stream is live, and `ready` (from `readReady`, or as the tab
   * holding the connection passed it on) says what to re-read: on a stream
   * of one scope, everything or nothing (`onResync()`); on a stream of
   * several, each scope named (`onResync(scope)`), or each it carries when
   * `resync` is true. A tab that joined a stream already in progress (or
   * took over one it never saw live) cannot replay what went by before it
   * listened, so it re-reads everything, whatever the relay asks for.
   */
  const onConnected = (s, ready) => {
    const everything = ready.resync === true || (!s.joined && s.adopted);
    s.joined = true;
    multi = ready.multi;
    // A relay names the scopes only on a stream of several; a stream of one
    // opened for one scope carries that one. Unreadable names: the ones
    // asked for, the best guess there is.
    const scopes = ready.scopes ?? (multi || requested?.length === 1 ? requested : undefined);
    carried = scopes && Object.freeze([...scopes]);
    const perScope = multi && carried !== undefined;
    if (perScope) {
      // Scopes the stream no longer carries (the credentials changed) have
      // no members to follow any more.
      for (const key of presences.keys()) if (!carried.includes(key)) presences.delete(key);
    }
    let resyncs;
    if (!perScope) resyncs = everything || ready.resync === true ? [undefined] : [];
    else resyncs = everything ? carried : ready.resync;
    setState(s, 'connected', { resync: perScope ? resyncs : resyncs.length > 0 });
    for (const scope of resyncs) {
      if (scope === undefined) call(settings.onResync);
      else call(settings.onResync, scope);
    }
  };

  /**
   * An operator took `scope` out of the stream, which goes on with the
   * others. Reported once: a stream opened to replace this one (a renewal)
   * may say so again, and so may the tab holding the connection.
   */
  const onScopeRevoked = (s, scope) => {
    if (!s.active) return;
    if (carried !== undefined) {
      if (!carried.includes(scope)) return;
      carried = Object.freeze(carried.filter((key) => key !== scope));
    }
    presences.delete(scope);
    report(new EventRelayError('revoked', `an operator took the scope ${JSON.stringify(scope)} out of this stream`, { scope }));
  };

  /**
   * Applies a presence frame (from the connection, or from the tab holding
   * it) and tells the application when anything changed: always at the
   * first snapshot, then only when the list or the count moved, so the
   * snapshot of a reconnect that finds everyone where they were, or one
   * repeated for a tab that joins, is silent.
   */
  const updatePresence = (s, frame) => {
    if (!s.active) return;
    const next = applyPresence(presences.get(frame.scopeKey), frame);
    if (!next || !next.change) return;
    // A stream of one scope has one list: one of another scope (the
    // credentials changed) replaces it.
    if (!multi) presences.clear();
    presences.set(frame.scopeKey, next.presence);
    call(settings.onPresence, next.presence, next.change);
  };

  /** Forgets what the last run knew about the stream: the next starts afresh. */
  const forgetStream = () => {
    presences.clear();
    carried = undefined;
    multi = false;
  };

  const stopSession = (s) => {
    if (session !== s) return;
    session = undefined;
    s.active = false;
    // A stopped client knows nothing current.
    forgetStream();
    s.controller.abort(); // ends the attempt, the backoff wait, and a lock request
    s.channel?.close();
    if (state !== 'stopped') {
      state = 'stopped';
      call(settings.onStateChange, 'stopped');
    }
  };

  /**
   * The request for one connection: the application's (or `url`), with the
   * token from `getToken` as its bearer credentials. A token is fetched only
   * when none is held: at the start, after a refusal, and for the stream
   * that replaces one whose token expires. Answers the token it used too.
   */
  async function streamRequest(s) {
    const request = settings.buildRequest ? await settings.buildRequest() : { url: settings.url };
    const url = requested ? withScopes(String(request.url), requested) : request.url;
    const headers = new Headers(request.headers ?? {});
    let token;
    if (settings.getToken) {
      if (s.token === undefined) {
        const fetched = await settings.getToken();
        if (typeof fetched !== 'string' || fetched === '') throw new TypeError('getToken must resolve to a non-empty string');
        // Only for the run that asked: a stop() meanwhile discards it.
        if (s.active) s.token = fetched;
        token = fetched;
      } else {
        token = s.token;
      }
      headers.set('authorization', `Bearer ${token}`);
    }
    return { url, headers, token };
  }

  /**
   * Opens a connection in the background. `finished` settles when it ends,
   * never rejects (it holds the error), so an attempt nobody awaits yet
   * cannot raise an unhandled rejection.
   */
  function startAttempt(s) {
    const attempt = {
      ready: false, // its relay sent `ready`
      closed: false, // replaced by its successor, which closed it
      close: () => {},
      token: undefined, // the token it was opened with
      successor: undefined, // the stream opened to replace it before it ends
    };
    attempt.finished = connectOnce(s, attempt).then(
      () => ({}),
      (error) => ({ error }),
    );
    return attempt;
  }

  /**
   * The relay warned that the stream's token expires soon (`reauth`): with
   * `getToken`, the next stream opens now, with a fresh token and the
   * watermark, while this one still delivers. Until the new one is live
   * both deliver, and the seen ids drop what arrives twice; at its `ready`,
   * `takeOver` closes the old one. So nothing falls between the two, and
   * nothing is delivered twice. Without `getToken`, the stream simply ends
   * and the client reconnects, as after any end.
   */
  function renew(s, outgoing) {
    if (!settings.getToken || outgoing.successor || outgoing.closed) return;
    // The token in hand is the expiring one: no later connection may use it.
    if (s.token === outgoing.token) s.token = undefined;
    const successor = startAttempt(s);
    outgoing.successor = successor;
    successor.finished.then(() => {
      // Failed before it was live while the old stream still runs: the old
      // one goes on, and when it ends the client reconnects as usual.
      if (!successor.ready && outgoing.successor === successor && s.current === outgoing) {
        outgoing.successor = undefined;
      }
    });
  }

  /**
   * A successor is live: it becomes the connection and closes the one it
   * replaces. The watermark stays where the old one left it (everything up
   * to it was delivered), and moves with the new one's frames from here on.
   */
  function takeOver(s, successor) {
    const outgoing = s.current;
    s.current = successor;
    if (outgoing && outgoing !== successor) {
      outgoing.closed = true;
      outgoing.close();
    }
  }

  /** A frame from the connection (only the tab holding it reads frames). */
  function onFrame(s, attempt, frame) {
    if (!s.active || attempt.closed) return;
    // A `ready` without an `id:` of its own is the relay's control frame:
    // the relay refuses application events under that name, and durable
    // ones always carry an id. (`frame.id` would not do: it keeps the last
    // id across frames.)
    if (frame.event === 'ready' && !frame.ownId) {
      const ready = readReady(parseJson(frame.data));
      if (!ready) {
        report(new EventRelayError('malformed_ready', 'skipped a malformed `ready` frame'));
        return;
      }
      // Still the stream's ready: only its scope lists are unreadable.
      if (ready.malformed) {
        report(new EventRelayError('malformed_ready', 'a `ready` frame named its scopes wrongly: re-reading every scope'));
      }
      attempt.ready = true;
      s.failures = 0;
      s.renewedAfterRefusal = false;
      if (attempt !== s.current) takeOver(s, attempt);
      onConnected(s, ready);
      return;
    }
    // The relay's warning that the stream's token expires in `expiresIn`
    // seconds, when the stream ends: time to open the next one (even
    // during a replay: a long one may outlast a short token).
    if (frame.event === 'reauth' && !frame.ownId) {
      if (attempt === s.current) renew(s, attempt);
      return;
    }
    // An operator disconnected the subscriber: the stream ends now. The
    // client reconnects as after any end; while the operator's denial lasts
    // the relay answers 403, which ends in `stopped` unless a fresh token
    // or `onUnauthorized` says otherwise. With a `scope`, only that scope
    // left a stream of several, which goes on with the others.
    if (frame.event === 'revoked' && !frame.ownId) {
      const revoked = parseJson(frame.data);
      if (isObject(revoked) && typeof revoked.scope === 'string') {
        post(s, { kind: 'revoked', scope: revoked.scope });
        onScopeRevoked(s, revoked.scope);
        return;
      }
      report(new EventRelayError('revoked', 'an operator disconnected this subscriber'));
      return;
    }
    // Who is connected to the scope: never an event, and without an id, so
    // the watermark stays. Only the stream the client is on counts: a
    // stream that replaces it starts with a snapshot of its own.
    if (frame.event === 'presence' && !frame.ownId) {
      if (attempt !== s.current) return;
      const data = readPresenceFrame(parseJson(frame.data));
      if (!data) {
        report(new EventRelayError('malformed_presence', 'skipped a malformed `presence` frame'));
        return;
      }
      post(s, { kind: 'presence', frame: data });
      updatePresence(s, data);
      return;
    }
    const envelope = parseJson(frame.data);
    // Only durable events move the watermark: an ephemeral id would point at
    // nothing in the outbox. An empty `id:` forgets it, as in a browser.
    // While two streams overlap, only the one the client is on moves it.
    if (frame.ownId && envelope?.lane === 'durable' && attempt === s.current) lastEventId = frame.id || undefined;
    const reserved = [frame.event, envelope?.type].find(isReservedEventType);
    if (reserved !== undefined) {
      // Never handed to the application: a control frame this version does
      // not know, or an event an older relay let through under such a name.
      const message = `dropped a frame with the reserved event type ${JSON.stringify(reserved)}`;
      report(new EventRelayError('reserved_event_type', message, { eventType: reserved }));
      return;
    }
    if (!isObject(envelope)) return;
    post(s, { kind: 'event', event: envelope, lastEventId });
    if (seen.add(envelope.id)) call(settings.onEvent, envelope);
  }

  /** One connection, from the request to the end of its body. */
  async function connectOnce(s, attempt) {
    // Its own controller, so the request and its body are released however
    // the attempt ends (a thrown error included), and a stop() or the
    // stream that replaces it ends it.
    const controller = new AbortController();
    const abort = () => controller.abort();
    attempt.close = abort;
    s.signal.addEventListener('abort', abort, { once: true });
    try {
      const request = await streamRequest(s);
      if (!s.active || controller.signal.aborted) return;
      attempt.token = request.token;
      const { headers } = request;
      headers.set('accept', 'text/event-stream');
      if (lastEventId) headers.set('last-event-id', String(lastEventId));
      const response = await fetch(request.url, { headers, signal: controller.signal, cache: 'no-store' });
      if (!response.ok) {
        const error = refusal(response);
        // A refused token is never sent again: the next attempt fetches one.
        if (error.code === 'unauthorized' && request.token !== undefined && s.token === request.token) {
          s.token = undefined;
        }
        throw error;
      }
      const type = response.headers.get('content-type') ?? '';
      if (!response.body || !type.toLowerCase().startsWith('text/event-stream')) {
        throw new EventRelayError('not_event_stream', `the relay answered ${JSON.stringify(type)}, not an event stream`);
      }
      const parser = new SseParser(
        (frame) => onFrame(s, attempt, frame),
        (ms) => {
          s.retryMs = ms;
        },
      );
      const reader = response.body.getReader();
      // A body that errors (the relay aborted the response, the network
      // dropped) rejects here and fails the attempt; only a body that ends
      // properly returns.
      for (;;) {
        const { done, value } = await reader.read();
        if (done || !s.active) return;
        parser.push(value);
      }
    } finally {
      s.signal.removeEventListener('abort', abort);
      controller.abort();
    }
  }

  const backoff = (s) => {
    const doublings = Math.min(Math.max(s.failures - 1, 0), 16);
    return Math.random() * Math.min(settings.maxDelayMs, s.retryMs * 2 ** doublings);
  };

  /** Holds the connection until the run stops: reconnects, backs off. */
  async function lead(s) {
    if (!s.active) return;
    s.leader = true;
    // A token fetched before following another tab's stream may have
    // expired while this tab waited: take over with a fresh one.
    if (s.adopted) s.token = undefined;
    // Taking over a stream another tab had open: to the app, a reconnect.
    setState(s, state === 'connecting' ? 'connecting' : 'reconnecting');
    while (s.active) {
      const attempt = s.current ?? (s.current = startAttempt(s));
      const { error } = await attempt.finished;
      if (!s.active) break;
      // Its successor went live and closed it: carry on with that one.
      if (s.current !== attempt) continue;
      if (attempt.successor) {
        // It ended before the stream opened to replace it was live: that
        // one is already on its way, so no wait.
        s.current = attempt.successor;
        setState(s, 'reconnecting');
        continue;
      }
      s.current = undefined;
      let wait;
      try {
        if (error) throw error;
        if (!attempt.ready) {
          // A token past its expiry but within the relay's clock leeway is
          // accepted, and its stream ends at once: never send it again.
          if (s.token !== undefined && s.token === attempt.token) s.token = undefined;
          // A relay that accepts and then drops every connection must still
          // lead to `degraded`: an attempt succeeds at `ready`, not at 200.
          throw new EventRelayError('ended_early', 'the stream ended before the relay was ready');
        }
        // Ended after `ready` (the age cap, `until`, an expired token): a
        // normal reconnect, replaying from the watermark.
        setState(s, 'reconnecting');
        wait = Math.random() * s.retryMs;
      } catch (caught) {
        let failure = caught;
        if (failure instanceof EventRelayError && failure.code === 'unauthorized') {
          // With `getToken`, a refusal means the token expired or was
          // revoked: a fresh one gets one try at once, once per stream
          // that reaches `ready`.
          if (settings.getToken && !s.renewedAfterRefusal) {
            s.renewedAfterRefusal = true;
            setState(s, 'reconnecting');
            continue;
          }
          let retry = false;
          try {
            retry = settings.onUnauthorized ? await settings.onUnauthorized(failure.status) : false;
          } catch (refreshError) {
            failure = refreshError;
          }
          if (!s.active) break;
          if (!retry) {
            stopSession(s);
            call(settings.onError, failure);
            break;
          }
        }
        // A refusal, an attempt that never reached `ready`, and a body that
        // errors all count towards `degraded`; `ready` resets the count.
        s.failures += 1;
        setState(s, s.failures >= settings.degradedAfter ? 'degraded' : 'reconnecting');
        // A relay that is shedding load says when to come back: wait at
        // least that long (up to a ceiling), the usual backoff if longer.
        const asked = Math.min(failure?.retryAfterMs ?? 0, settings.maxRetryAfterMs);
        wait = Math.max(backoff(s), asked);
      }
      await delay(wait, s.signal);
    }
  }

  /** A message from another tab of the same stream. */
  function onMessage(s, message) {
    if (!s.active || !isObject(message)) return;
    if (s.leader) {
      // A tab that just opened asks where the stream stands, and who is
      // here: the changes it hears from now on apply to this snapshot.
      if (message.kind === 'hello') {
        post(s, { kind: 'state', state, lastEventId, multi, scopes: carried });
        for (const presence of presences.values()) post(s, { kind: 'presence', frame: presenceSnapshot(presence) });
      }
      return;
    }
    if (message.kind === 'presence') {
      const frame = readPresenceFrame(message.frame);
      if (frame) updatePresence(s, frame);
      return;
    }
    if (message.kind === 'revoked') {
      if (typeof message.scope === 'string') onScopeRevoked(s, message.scope);
      return;
    }
    if (message.kind !== 'event' && message.kind !== 'state') return;
    s.adopted = true;
    // The shared watermark: whichever tab holds the connection next
    // resumes from it, so a hand-over loses nothing.
    if (message.lastEventId !== undefined) lastEventId = message.lastEventId;
    if (message.kind === 'event') {
      if (isObject(message.event) && seen.add(message.event.id)) call(settings.onEvent, message.event);
    } else if (message.state === 'connected') {
      // As the tab holding the connection read the relay's `ready`; what
      // does not read as such re-reads everything.
      const perScope = message.multi === true && isScopeList(message.scopes) && message.scopes.length > 0;
      let resync = message.resync === true;
      if (perScope && message.resync !== undefined) resync = isScopeList(message.resync) ? message.resync : true;
      else if (perScope) resync = [];
      onConnected(s, { multi: message.multi === true, scopes: perScope ? message.scopes : undefined, resync });
    } else if (FOLLOWED_STATES.has(message.state)) {
      setState(s, message.state);
    }
  }

  /** Waits for the lock; until then, follows the tab that holds it. */
  async function share(s) {
    let name;
    try {
      // With `getToken`, the token fetched here is the one this tab
      // connects with if it gets the lock at once.
      name = SHARE_PREFIX + (settings.shareName ?? (await deriveShareName(await streamRequest(s))));
    } catch {
      // No request to derive the name from (say, the token could not be
      // fetched): connect alone; the connection loop retries that request.
      return lead(s);
    }
    if (!s.active) return;
    try {
      s.channel = new BroadcastChannel(name);
      s.channel.onmessage = (event) => onMessage(s, event.data);
      post(s, { kind: 'hello' });
      // The lock is held for as long as `lead` runs: until stop(), or
      // until the tab goes away, when the browser hands it to the next one.
      await navigator.locks.request(name, { signal: s.signal }, () => lead(s));
    } catch (error) {
      if (!s.active) return; // stopped while waiting for the lock
      if (s.leader) throw error;
      // An opaque origin (a sandboxed frame, a file: page) may not take
      // locks: connect alone.
      s.channel?.close();
      s.channel = undefined;
      return lead(s);
    }
  }

  const client = {
    start() {
      if (session) return;
      const controller = new AbortController();
      const s = {
        active: true,
        controller,
        signal: controller.signal,
        channel: undefined,
        leader: false,
        joined: false, // saw the stream live
        adopted: false, // followed another tab's stream
        failures: 0, // failed attempts since the last `ready`
        retryMs: settings.initialDelayMs,
        current: undefined, // the connection being read (or opened)
        token: undefined, // from `getToken`, reused until it is refused or expires
        renewedAfterRefusal: false, // a refusal fetched a fresh token since the last `ready`
      };
      session = s;
      forgetStream();
      setState(s, 'connecting');
      (sharing ? share(s) : lead(s)).catch((error) => {
        if (s.active) report(error);
      });
    },
    stop() {
      if (session) stopSession(session);
    },
    get state() {
      return state;
    },
    get lastEventId() {
      return lastEventId;
    },
    get isLeader() {
      return session?.leader ?? false;
    },
    /** The members of a stream of one scope, once the relay sent a snapshot; undefined in a scope without presence. */
    get presence() {
      return multi ? undefined : presences.values().next().value;
    },
    /** The scopes the stream carries, from the last `ready`. */
    get scopes() {
      return carried;
    },
    /** The members of one of the stream's scopes, once the relay sent its snapshot. */
    presenceOf(scope) {
      return presences.get(scope);
    },
  };
  return client;
}
