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

export type ConnectionState = 'connecting' | 'connected' | 'reconnecting' | 'degraded' | 'stopped';

export interface StreamRequest {
  url: string;
  headers?: Record<string, string>;
}

export interface ClientOptions {
  /** Called on every connect, so credentials are always fresh. */
  buildRequest: () => StreamRequest | Promise<StreamRequest>;
  onEvent?: (event: EventEnvelope) => void;
  onStateChange?: (state: ConnectionState) => void;
  /** The relay says events may have been missed: re-read what the page shows. */
  onResync?: () => void;
  /** 401/403: return true after refreshing credentials to retry; otherwise the client stops. */
  onUnauthorized?: (status: number) => boolean | Promise<boolean>;
  onError?: (error: Error) => void;
  /** Resume after this seq (a watermark saved earlier). */
  lastEventId?: string;
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Consecutive failures before the state becomes `degraded`. */
  degradedAfter?: number;
  /** How many event ids are remembered for de-duplication. */
  seenCapacity?: number;
}

export interface EventStreamClient {
  start(): void;
  stop(): void;
  readonly state: ConnectionState;
  /** The last durable `id:` seen: the replay watermark. */
  readonly lastEventId: string | undefined;
}

export function createEventStreamClient(options: ClientOptions): EventStreamClient;

export interface SseFrame {
  /** The last `id:` seen on the stream (kept across frames). */
  id: string | undefined;
  event: string;
  data: string;
}

/** The stream parser, exported for reuse and tests. */
export class SseParser {
  constructor(onEvent: (frame: SseFrame) => void, onRetry?: (ms: number) => void);
  push(chunk: Uint8Array | string): void;
}
