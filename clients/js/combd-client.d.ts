// Types of combd-client (combd-client.js; README.md says what each does).

/** A connection's state (README "States"). */
export type State =
  | "connecting"
  | "open"
  | "live"
  | "reconnecting"
  | "busy"
  | "invalid"
  | "unauthorized"
  | "closed";

/** What onState's third argument says: why a retry waits, or how a connection ended. */
export interface StateInfo {
  /** The reason without "retrying in …", while a retry waits. */
  reason?: string;
  /** How long the retry waits, in milliseconds. */
  wait?: number;
  /** The close code of a connection that was open. */
  code?: number;
  /** The HTTP status of a refused upgrade (0: no answer at all). */
  status?: number;
  /** The node's own reason for a refused upgrade (its JSON error body). */
  error?: string;
}

/** Where a numbered client stands in its topic's log. */
export interface Place {
  epoch: number;
  last: number;
}

/** A member of a topic's presence. */
export interface Member {
  who: string;
  verified: boolean;
  name?: string;
  devices: number;
  since: number;
}

/** A change of a topic's presence (null for the members as the connection attached). */
export type PresenceChange = { join?: Member[]; leave?: string[] } | null;

/** A message as onMessage gets it: parsed JSON, else the text, or binary data. */
export type Message = any;

/** What a refused upgrade means to the client (see refusal()). */
export interface Refusal {
  state: State;
  why: string;
  wait?: number;
}

/** How many messages (and bytes) send() keeps while the connection is not open. */
export interface SendBuffer {
  messages: number;
  bytes: number;
}

/** A WebSocket class, as the browsers', Node.js's, or the ws package's. */
export type WebSocketClass = new (url: string, protocols?: string | string[]) => WebSocket;

export interface ConnectOptions {
  /** A token offered as the subprotocol combd.bearer.<token>. */
  token?: string;
  /** More subprotocols to offer. */
  protocols?: string[];
  /** The query, asked again at every (re)connect. */
  query?: () => Record<string, string>;
  /** A numbered connection: it keeps its place and resumes from it. */
  numbered?: boolean;
  onMessage?: (message: Message, info?: { seq: number }) => void;
  onState?: (state: State, why: string, info: StateInfo) => void;
  onPosition?: (epoch: number, last: number, why: "new" | "resumed" | "snapshot") => void;
  onPresence?: (members: Map<string, Member>, change: PresenceChange) => void;
  onAttempt?: (attempt: number) => void;
  /** What a refused upgrade's HTTP answer means (default: refusal()); null: reconnect. */
  refusal?: (status: number, retryAfter: string | null | undefined, error?: string) => Refusal | null;
  /** What a relative path is resolved against (default: the page's location). */
  base?: string;
  /** The WebSocket class (default: the global one). */
  WebSocketImpl?: WebSocketClass | null;
  /** The fetch function a refused upgrade is asked about with (default: the global one). */
  fetchImpl?: typeof fetch;
  /** The randomness of the backoff's jitter. */
  random?: () => number;
  /** What send() keeps while not open (default: 100 messages, 1 MiB). */
  sendBuffer?: SendBuffer;
}

export interface Client {
  readonly state: State;
  readonly lastClose: { code: number; reason: string } | null;
  readonly attempts: number;
  /** Messages send() kept while not open. */
  readonly buffered: number;
  /** A numbered client's place in its topic's log. */
  readonly place: Place | null;
  /** The topic's members (a numbered client of an app that keeps presence). */
  readonly presence: Map<string, Member>;
  /** Sessions attached to the topic but not listed. */
  readonly unlisted: number;
  /** Sends (an object as JSON); kept while not open: false when it could not be. */
  send(message: unknown): boolean;
  /** Drops what send() kept; how many. */
  dropBuffered(): number;
  close(): void;
  retryNow(): void;
  setToken(token: string): void;
}

/** One subscription of a multiplexed connection. */
export interface Subscription {
  readonly ch: number;
  readonly target: string;
  readonly state: "subscribing" | "live" | "reconnecting" | "busy" | "invalid" | "unauthorized" | "closed";
  readonly place: Place | null;
  readonly presence: Map<string, Member>;
  readonly unlisted: number;
  readonly lastEnd: { status?: number; code?: number; error?: string } | null;
  /** Sends on this subscription; false while its socket is not open (nothing is kept). */
  send(message: unknown): boolean;
  close(): void;
}

export interface SubscribeOptions {
  query?: () => Record<string, string>;
  numbered?: boolean;
  onMessage?: (message: Message, info: { seq: number }) => void;
  onPosition?: (epoch: number, last: number, why: "new" | "resumed" | "snapshot") => void;
  onPresence?: (members: Map<string, Member>, change: PresenceChange) => void;
  onState?: (state: Subscription["state"], why: string, info: Record<string, unknown>) => void;
}

export interface Multiplexed extends Client {
  readonly subscriptions: Map<number, Subscription>;
  subscribe(app: string, name: string, options?: SubscribeOptions): Subscription;
}

export interface MultiplexOptions extends Omit<ConnectOptions, "numbered" | "onMessage" | "onPosition" | "onPresence" | "query"> {
  /** The multiplexed socket's path (default /ws). */
  path?: string;
}

/** What each close code means. */
export const CLOSE_REASONS: Record<number, string>;

/** The backoff's wait after `failures` failures: min doubling to max, jittered. */
export function backoff(failures: number, options?: { min?: number; max?: number; random?: () => number }): number;

/** The state a refused upgrade's HTTP answer means; null: reconnect. */
export function refusal(status: number, retryAfter?: string | null, error?: string): Refusal | null;

/** A message's header and payload; null without a `|`. */
export function split(data: string | ArrayBuffer): [string, string | ArrayBuffer] | null;

/** Connects to an object (its path, or a whole ws:// URL) and keeps the connection up. */
export function connect(path: string, options?: ConnectOptions): Client;

/** Many subscriptions on one WebSocket (GET /ws). */
export function multiplex(options?: MultiplexOptions): Multiplexed;
