// eventrelay browser client: reads the relay's Server-Sent Events stream with
// fetch (so it can send an Authorization header, which EventSource cannot),
// replays from a durable-only watermark, reconnects with full-jitter backoff,
// and de-duplicates at-least-once delivery by envelope id. No dependencies;
// runs in browsers, workers and Node 20+.

/** @typedef {'connecting'|'connected'|'reconnecting'|'degraded'|'stopped'} ConnectionState */

const DEFAULTS = {
  initialDelayMs: 1000,
  maxDelayMs: 30000,
  degradedAfter: 3,
  seenCapacity: 1000,
};

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
  // frame without `id:` keeps the last one.
  reset() {
    this.data = [];
    this.eventType = '';
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
        this.onEvent({ id: this.id, event: this.eventType || 'message', data: this.data.join('\n') });
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
        if (!value.includes('\0')) this.id = value;
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

class Unauthorized extends Error {
  constructor(status) {
    super(`the relay refused the credentials (${status})`);
    this.status = status;
  }
}

/**
 * Creates a client. Call `start()` to connect and `stop()` to end.
 * @param {import('./eventrelay-client').ClientOptions} options
 */
export function createEventStreamClient(options) {
  const settings = { ...DEFAULTS, ...options };
  const seen = new SeenIds(settings.seenCapacity);
  let state = 'stopped';
  let lastEventId = settings.lastEventId;
  let failures = 0;
  let retryMs = settings.initialDelayMs;
  let controller;
  let running = false;

  const setState = (next) => {
    if (next === state) return;
    state = next;
    settings.onStateChange?.(next);
  };

  const delay = (ms, signal) =>
    new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        resolve();
      });
    });

  const backoff = () => {
    const ceiling = Math.min(settings.maxDelayMs, retryMs * 2 ** Math.min(failures - 1, 16));
    return Math.random() * ceiling;
  };

  async function connectOnce(signal) {
    const request = await settings.buildRequest();
    const headers = new Headers(request.headers ?? {});
    headers.set('accept', 'text/event-stream');
    if (lastEventId !== undefined) headers.set('last-event-id', String(lastEventId));
    const response = await fetch(request.url, { headers, signal, cache: 'no-store' });
    if (response.status === 401 || response.status === 403) throw new Unauthorized(response.status);
    if (!response.ok || !response.body) throw new Error(`the relay answered ${response.status}`);

    const parser = new SseParser(
      (frame) => {
        if (frame.event === 'ready') {
          failures = 0;
          setState('connected');
          const ready = JSON.parse(frame.data);
          if (ready.resync) settings.onResync?.();
          return;
        }
        let envelope;
        try {
          envelope = JSON.parse(frame.data);
        } catch {
          return;
        }
        // Only durable events move the watermark: an ephemeral id would
        // point at nothing in the outbox.
        if (frame.id !== undefined && envelope.lane === 'durable') lastEventId = frame.id;
        if (seen.add(envelope.id)) settings.onEvent?.(envelope);
      },
      (ms) => {
        retryMs = ms;
      },
    );
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      parser.push(value);
    }
  }

  async function run() {
    controller = new AbortController();
    const { signal } = controller;
    setState('connecting');
    while (running) {
      try {
        await connectOnce(signal);
        // A clean end (age cap, `until`): reconnect at once, replaying.
        if (!running) break;
        setState('reconnecting');
        await delay(Math.random() * retryMs, signal);
      } catch (error) {
        if (!running) break;
        if (error instanceof Unauthorized) {
          const retry = settings.onUnauthorized ? await settings.onUnauthorized(error.status) : false;
          if (!retry) {
            running = false;
            settings.onError?.(error);
            break;
          }
        }
        failures += 1;
        setState(failures >= settings.degradedAfter ? 'degraded' : 'reconnecting');
        await delay(backoff(), signal);
      }
    }
    setState('stopped');
  }

  return {
    start() {
      if (running) return;
      running = true;
      run();
    },
    stop() {
      running = false;
      controller?.abort();
      setState('stopped');
    },
    get state() {
      return state;
    },
    get lastEventId() {
      return lastEventId;
    },
  };
}
