// Generated from combd-client.js by build-cjs.mjs: edit that file, not this one.
"use strict";
// combd-client: a WebSocket to a combd object that stays connected, says what state it is in,
// and resumes where it left off. An ES module with no dependencies, for browsers and for
// Node.js (22, or 20 with --experimental-websocket, or any runtime given a WebSocket class as
// WebSocketImpl, e.g. the ws package's). README.md has the whole API; combd-client.d.ts its types.
//
//   import { connect } from "/combd-client.js";
//   const room = connect("/o/chat/lobby", {
//     token,                                   // offered as the subprotocol combd.bearer.<token>
//     query: () => ({ after: String(last) }),  // asked again at every (re)connect
//     onMessage: (m) => { ... },               // every message, parsed as JSON when it is JSON
//     onState: (state, why, info) => { ... },
//   });
//   room.send({ t: "say", text: "hi" });
//
// Sending: send() while the connection is not open keeps the message (at most sendBuffer's
// messages and bytes: { messages: 100, bytes: 1 MiB } by default) and sends what it kept, in
// order, as the next connection opens; it answers false for one it could not keep (the buffer
// full, or the client invalid or closed). client.buffered counts them; dropBuffered() drops them.
//
// States: connecting, open (the WebSocket is open, nothing came on it yet), live (a first
// message came on this connection; numbered: its position), reconnecting (waiting
// out a jittered backoff: 0.5 s doubling to 30 s, back to 0.5 s once a connection delivers a
// message), busy (the node is full or asked to try later: 503 with retry-after, 1013),
// invalid (the request itself is wrong: 400, 404; no retry), unauthorized (401: the token is
// missing, expired or refused; no retry until a new token is given with setToken), closed
// (close() was called). Close codes honoured: 1001 (the node restarts: reconnect), 1008 (too
// many messages, or reading too slowly: wait longer), 1013 (try again later: busy), 3000 (the
// session's token expired: unauthorized, until setToken gives a new one), 1012 (the object was
// restored from its backup: reconnect to it as restored), 4404 (the object was
// deleted: reconnecting attaches to a new, empty object of the name). A node
// that closed with 1001 and cannot be reached yet is still restarting: reconnecting, not busy.
//
// Numbered (`numbered: true`, README "Resuming a WebSocket"): the node numbers every broadcast
// in its topic's log, and the client keeps its place (client.place: { epoch, last }) and
// reconnects with it (`combd_after`), so it gets exactly the broadcasts it missed, in order,
// none twice; onMessage gets each message's payload and { seq } (0: a message to this session
// alone). A broadcast that skips a number (the session fell behind) drops the connection and
// resumes from the place. onPosition: (epoch, last, why) => { ... } when the node says where
// the log is (why: "new", "resumed", or "snapshot": the place was gone, the app's attach
// sends the state).
//
// Presence (numbered, of an app that keeps it, README "Presence"): client.presence is a Map
// of the topic's members (who => { who, verified, name, devices, since }) and
// client.unlisted the sessions attached but not listed, kept from the node's members and
// changes; onPresence: (members, change) => { ... } after each (change: null for the members
// as the connection attached, else { join, leave }).
//
// For a page that shows more than the state (all optional):
//   onState's third argument: { reason, wait } while a retry waits (`why` without its
//     "retrying in …", and the wait in ms); with { code } after an open connection closed,
//     or { status, error } after a refused upgrade (its HTTP status, 0 for no answer at all;
//     the node's own reason, from a JSON error body).
//   onAttempt: (n) => { ... }: each WebSocket as it opens (client.attempts counts them); a
//     retry keeps the state reconnecting or busy while it runs.
//   refusal: (status, retryAfter, error) => ({ state, why, wait }) or null: what a refused
//     upgrade's HTTP answer means (default: refusal() below; null: reconnect).

const CLOSE_REASONS = {
  1000: "closed",
  1001: "the node is restarting",
  1006: "connection lost",
  1008: "too many messages, or reading too slowly",
  1009: "a message too big",
  1011: "node error",
  1012: "the object was restored",
  1013: "the node asked to try again later",
  3000: "the token expired",
  4404: "the object was deleted",
};

/** Backoff: `min` doubling to `max`, each wait jittered to between half and all of it. */
function backoff(failures, { min = 500, max = 30000, random = Math.random } = {}) {
  const full = Math.min(max, min * 2 ** Math.max(0, failures - 1));
  return full * (0.5 + random() / 2);
}

/**
 * The state a refused upgrade means, from the plain HTTP answer to the same request (status 0:
 * none came); `error` is the node's reason from the answer's JSON, if it gave one.
 */
function refusal(status, retryAfter, error) {
  if (status === 401) return { state: "unauthorized", why: "the token was refused" };
  if (status === 403) return { state: "invalid", why: "this page's origin is not allowed" };
  if (status === 400 || status === 404) return { state: "invalid", why: error || `the node answered ${status}` };
  if (status === 503 || status === 429) {
    const s = Number.parseInt(retryAfter ?? "", 10);
    return { state: "busy", why: "the node is busy", wait: Number.isFinite(s) && s > 0 ? s * 1000 : undefined };
  }
  return null;
}

/** A message's header (up to its first `|`) and payload (text, or an ArrayBuffer for a binary
 * message, whose header is ASCII); null without a `|`. */
function split(data) {
  if (typeof data === "string") {
    const bar = data.indexOf("|");
    return bar < 0 ? null : [data.slice(0, bar), data.slice(bar + 1)];
  }
  const bytes = new Uint8Array(data);
  const bar = bytes.indexOf(0x7c);
  if (bar < 0) return null;
  return [new TextDecoder().decode(bytes.subarray(0, bar)), bytes.slice(bar + 1).buffer];
}

/**
 * A reader of one connection's numbered messages for `s` (which keeps `place`, `presence` and
 * `unlisted`): given a message's header and payload, the payload and { seq } to pass on, or
 * null (a position, presence, a broadcast it has, or one from before this connection's
 * position). `gap()` when a broadcast skips a number (the session fell behind: resume from
 * the place); `delivered()` on a position.
 */
function numbering(s, { onPosition, onPresence, gap, delivered }) {
  let placed = false; // a position came on this connection: numbers count from it
  let present = false; // the members came on this connection: changes apply from them
  // The topic's members (replacing what it had) or a change of them (applied once the members
  // came on this connection; dropped before).
  const presence = (p) => {
    if (Array.isArray(p.members)) {
      s.presence = new Map(p.members.map((m) => [m.who, m]));
    } else if (present) {
      for (const m of p.join ?? []) s.presence.set(m.who, m);
      for (const who of p.leave ?? []) s.presence.delete(who);
    } else {
      return;
    }
    present = true;
    s.unlisted = p.unlisted ?? 0;
    onPresence(s.presence, Array.isArray(p.members) ? null : { join: p.join, leave: p.leave });
  };
  return (header, payload) => {
    if (header === "!presence") {
      presence(JSON.parse(payload));
      return null;
    }
    if (header.startsWith("!")) {
      const [epoch, last] = header.slice(1).split(".").map(Number);
      if (payload !== "resumed" || !s.place) s.place = { epoch, last };
      else s.place.epoch = epoch;
      placed = true;
      onPosition(epoch, last, payload);
      delivered();
      return null;
    }
    if (header === "") return [payload, { seq: 0 }];
    const seq = Number(header);
    if (!placed || seq <= s.place.last) return null;
    if (seq > s.place.last + 1) {
      placed = false;
      gap();
      return null;
    }
    s.place.last = seq;
    return [payload, { seq }];
  };
}

/**
 * Connects to `path` (an object's URL path, or a whole ws:// or wss:// URL) and keeps the
 * connection up. Returns { send, dropBuffered, close, retryNow, setToken, state, lastClose, attempts,
 * buffered, place, presence, unlisted }.
 */
function connect(path, options = {}) {
  const {
    token: firstToken,
    protocols = [],
    query = () => ({}),
    numbered = false,
    onPosition = () => {},
    onPresence = () => {},
    onMessage = () => {},
    onState = () => {},
    onAttempt = () => {},
    onOpen = () => {},
    raw = false,
    refusal: readRefusal = refusal,
    base = globalThis.location ? globalThis.location.href : undefined,
    WebSocketImpl = globalThis.WebSocket,
    fetchImpl = globalThis.fetch,
    random = Math.random,
    sendBuffer = { messages: 100, bytes: 1 << 20 },
  } = options;
  if (typeof WebSocketImpl !== "function") {
    throw new TypeError(
      "combd-client: this runtime has no WebSocket: use Node.js 22 or newer (20 with " +
      "--experimental-websocket), or pass one as WebSocketImpl (e.g. the ws package's WebSocket)",
    );
  }
  const kept = []; // what send() kept while the connection was not open
  let keptBytes = 0;
  let token = firstToken;
  let ws = null;
  let failures = 0;
  let timer = null;
  let stopped = false;
  let attempting = false; // a WebSocket is opening or open, or why it ended is being asked
  let restarting = false; // the last connection that opened was closed with 1001
  const client = {
    state: "connecting", lastClose: null, attempts: 0, place: null,
    presence: new Map(), unlisted: 0, buffered: 0,
  };

  function setState(state, why = "", info = {}) {
    client.state = state;
    onState(state, why, info);
  }

  function url(scheme) {
    const u = new URL(path, base);
    u.protocol = scheme === "ws" ? (u.protocol === "https:" || u.protocol === "wss:" ? "wss:" : "ws:")
      : (u.protocol === "wss:" || u.protocol === "https:" ? "https:" : "http:");
    for (const [k, v] of Object.entries(query() ?? {})) u.searchParams.set(k, v);
    if (numbered && scheme === "ws") {
      const p = client.place;
      u.searchParams.set("combd_after", p ? `${p.epoch}.${p.last}` : "new");
    }
    return u.toString();
  }

  function wait(ms, state, why, info = {}) {
    clearTimeout(timer);
    setState(state, `${why}; retrying in ${(ms / 1000).toFixed(1)} s`, { ...info, reason: why, wait: ms });
    timer = setTimeout(open, ms);
  }

  function retry(why, state = "reconnecting", extra = 0, info = {}) {
    if (stopped) return;
    failures += 1;
    wait(backoff(failures, { random }) + extra, state, why, info);
  }

  // A WebSocket refused before it opened says nothing about why: ask the same URL over HTTP.
  // Its status (0: no answer), retry-after, and the node's reason from a JSON error body.
  async function probe() {
    try {
      const headers = token ? { authorization: `Bearer ${token}` } : {};
      const r = await fetchImpl(url("http"), { headers, cache: "no-store" });
      let error;
      if (!r.ok) {
        try {
          const body = await r.json();
          if (typeof body?.error === "string") error = body.error;
        } catch { /* not JSON: no reason */ }
      }
      return { status: r.status, retryAfter: r.headers.get("retry-after"), error };
    } catch {
      return { status: 0 };
    }
  }

  function open() {
    if (stopped) return;
    clearTimeout(timer);
    attempting = true;
    client.attempts += 1;
    if (client.state !== "reconnecting" && client.state !== "busy") setState("connecting");
    onAttempt(client.attempts);
    const offered = [...protocols];
    if (token) offered.push("combd", `combd.bearer.${token}`);
    let opened = false;
    let greeted = false;
    try {
      ws = new WebSocketImpl(url("ws"), offered);
    } catch (err) {
      // A URL no WebSocket can have: the request itself is wrong.
      attempting = false;
      ws = null;
      client.dropBuffered();
      setState("invalid", err.message);
      return;
    }
    if (numbered || raw) ws.binaryType = "arraybuffer";
    // A raw connection (multiplex()) is live as it opens: its messages are its subscriptions'.
    ws.onopen = () => {
      opened = true;
      if (raw) {
        delivered();
        onOpen();
        return;
      }
      setState("open");
      flush();
    };
    const read = numbering(client, {
      onPosition, onPresence, delivered: () => delivered(), gap: () => ws.close(4001, "a gap: resuming"),
    });
    ws.onmessage = (e) => {
      let m = e.data;
      let info;
      if (raw) {
        onMessage(m);
        return;
      }
      if (numbered) {
        const parts = split(m);
        const taken = parts && read(...parts);
        if (!taken) return;
        [m, info] = taken;
      }
      if (typeof m === "string") {
        try { m = JSON.parse(m); } catch { /* not JSON: passed on as text */ }
      }
      delivered();
      onMessage(m, info);
    };
    // The first message on this connection (for a numbered one, its position) makes it live.
    const delivered = () => {
      if (greeted) return;
      greeted = true;
      failures = 0; // this connection delivered: the next loss starts the backoff again
      setState("live");
    };
    // A handshake the node refused fires `error` and then (in browsers) `close` with 1006;
    // some runtimes fire only the `error`: whichever comes first ends this connection.
    let ended = false;
    ws.onerror = () => {
      if (!opened) end({ code: 1006, reason: "" });
    };
    ws.onclose = (e) => end(e);
    const end = async (e) => {
      if (ended) return;
      ended = true;
      client.lastClose = { code: e.code, reason: e.reason };
      if (stopped) {
        attempting = false;
        return;
      }
      if (!opened) {
        const answer = await probe();
        attempting = false;
        if (stopped) return;
        const info = { status: answer.status };
        if (answer.error) info.error = answer.error;
        // No answer at all after a 1001: the node is still restarting (not full).
        const r = answer.status === 0 && restarting
          ? { state: "reconnecting", why: CLOSE_REASONS[1001] }
          : readRefusal(answer.status, answer.retryAfter, answer.error);
        if (r && (r.state === "unauthorized" || r.state === "invalid")) {
          if (r.state === "invalid") client.dropBuffered();
          setState(r.state, r.why, info);
          return;
        }
        if (r) {
          failures += 1;
          wait(r.wait ?? backoff(failures, { random }), r.state, r.why, info);
          return;
        }
        retry("cannot connect", "reconnecting", 0, info);
        return;
      }
      attempting = false;
      restarting = e.code === 1001;
      const why = CLOSE_REASONS[e.code] ?? `closed (${e.code})`;
      const info = { code: e.code };
      if (e.code === 3000) setState("unauthorized", why, info);
      else if (e.code === 1013) retry(why, "busy", 0, info);
      else if (e.code === 1008) retry(why, "reconnecting", 5000, info);
      else retry(why, "reconnecting", 0, info);
    };
  }

  // Sends what send() kept, in order, on the connection that just opened.
  function flush() {
    while (kept.length > 0 && ws && ws.readyState === 1) ws.send(kept.shift());
    keptBytes = kept.reduce((n, m) => n + m.length, 0);
    client.buffered = kept.length;
  }

  client.send = (message) => {
    const text = typeof message === "string" ? message : JSON.stringify(message);
    if (ws && ws.readyState === 1) {
      ws.send(text);
      return true;
    }
    // A raw connection's messages are its subscriptions' own (they subscribe again as it
    // opens); a client that will not connect again keeps nothing.
    const never = stopped || client.state === "invalid";
    if (raw || never || kept.length >= sendBuffer.messages || keptBytes + text.length > sendBuffer.bytes) {
      return false;
    }
    kept.push(text);
    keptBytes += text.length;
    client.buffered = kept.length;
    return true;
  };
  client.dropBuffered = () => {
    const n = kept.length;
    kept.length = 0;
    keptBytes = 0;
    client.buffered = 0;
    return n;
  };
  client.close = () => {
    stopped = true;
    clearTimeout(timer);
    if (ws) ws.close(1000);
    client.dropBuffered();
    setState("closed");
  };
  client.retryNow = () => {
    // Not while an attempt runs (a second WebSocket would race the first).
    if (stopped || attempting || client.state === "live" || client.state === "connecting") return;
    open();
  };
  client.setToken = (t) => {
    token = t;
    if (client.state === "unauthorized") {
      failures = 0;
      open();
    }
  };
  open();
  return client;
}

/**
 * Many subscriptions on one WebSocket (`GET /ws`, README "Many subscriptions on one socket"):
 * a connection as connect() keeps it (token, states, backoff), on which
 * `client.subscribe(app, name, options)` opens a subscription to object `name` of `app`, each
 * with its own place and presence, subscribed again from its place whenever the connection
 * comes back:
 *
 *   const hub = multiplex({ token });
 *   const lobby = hub.subscribe("chat", "lobby", {
 *     numbered: true, query: () => ({}), onMessage: (m, { seq }) => {}, onPresence: (members) => {},
 *     onPosition: (epoch, last, why) => {}, onState: (state, why, info) => {},
 *   });
 *   lobby.send({ t: "say", text: "hi" });
 *   lobby.close();
 *
 * A subscription's states: subscribing, live (the node took it), reconnecting (its socket is
 * down, or the node ended it: again after a backoff), busy (refused 503 or 429: again after a
 * backoff), invalid (refused 400, 404: any 4xx but 401 and 429; not again), unauthorized (401: not again), closed.
 */
function multiplex(options = {}) {
  const { path = "/ws", random = Math.random, onState = () => {}, ...rest } = options;
  const subs = new Map();
  let next = 1;
  const demux = (data) => {
    const parts = split(data);
    if (!parts) return;
    const [header, payload] = parts;
    const op = header[0] === "+" || header[0] === "-" ? header[0] : "";
    const s = subs.get(Number(header.slice(op.length)));
    if (!s) return;
    if (op === "+") s.taken();
    else if (op === "-") s.ended(payload);
    else s.message(payload);
  };
  const client = connect(path, {
    ...rest,
    random,
    raw: true,
    onOpen: () => subs.forEach((s) => s.open()),
    onMessage: demux,
    onState: (state, why, info) => {
      if (state !== "live") subs.forEach((s) => s.down(why));
      onState(state, why, info);
    },
  });
  client.subscriptions = subs;
  client.subscribe = (app, name, opts = {}) => {
    const target = `${app}/${name}`;
    const ch = next;
    next += 1;
    const s = subscription(client, ch, target, opts, random, () => subs.delete(ch));
    subs.set(ch, s);
    if (client.state === "live") s.open();
    return s;
  };
  return client;
}

/** One subscription of a multiplexed connection `client` (see multiplex()). */
function subscription(client, ch, target, opts, random, forget) {
  const {
    query = () => ({}), numbered = false,
    onMessage = () => {}, onPosition = () => {}, onPresence = () => {}, onState = () => {},
  } = opts;
  const s = { ch, target, state: "subscribing", place: null, presence: new Map(), unlisted: 0, lastEnd: null };
  let read = null;
  let timer = null;
  let failures = 0;
  const setState = (state, why = "", info = {}) => {
    s.state = state;
    onState(state, why, info);
  };
  const final = () => ["closed", "invalid", "unauthorized"].includes(s.state);
  s.open = () => {
    if (final()) return;
    clearTimeout(timer);
    const q = new URLSearchParams(query() ?? {});
    if (numbered) q.set("combd_after", s.place ? `${s.place.epoch}.${s.place.last}` : "new");
    const qs = q.toString();
    read = numbered ? numbering(s, {
      onPosition, onPresence, delivered: () => {},
      // Behind: ended and subscribed again from its place (its `-` answer opens it again).
      gap: () => { read = null; client.send(`-${ch}|`); },
    }) : null;
    if (client.send(`+${ch}|${target}${qs ? `?${qs}` : ""}`)) setState("subscribing");
  };
  s.taken = () => {
    failures = 0;
    setState("live");
  };
  s.message = (payload) => {
    let m = payload;
    let info = { seq: 0 };
    if (numbered) {
      const parts = read && split(payload);
      const taken = parts && read(...parts);
      if (!taken) return;
      [m, info] = taken;
    }
    if (typeof m === "string") {
      try { m = JSON.parse(m); } catch { /* not JSON: passed on as text */ }
    }
    onMessage(m, info);
  };
  s.ended = (why) => {
    read = null;
    if (why === "") {
      s.open(); // the client's own unsubscribe, after a gap: again from its place
      return;
    }
    let w = {};
    try { w = JSON.parse(why); } catch { /* no reason */ }
    s.lastEnd = w;
    if (w.status === 401) {
      setState("unauthorized", w.error ?? "unauthorized", w);
      return;
    }
    if (w.status >= 400 && w.status < 500 && w.status !== 429) {
      setState("invalid", w.error ?? `refused ${w.status}`, w);
      return;
    }
    failures += 1;
    const wait = backoff(failures, { random });
    setState(w.status ? "busy" : "reconnecting", w.error ?? "ended", { ...w, wait });
    timer = setTimeout(s.open, wait);
  };
  s.down = (why) => {
    read = null;
    clearTimeout(timer);
    if (!final()) setState("reconnecting", why);
  };
  s.send = (m) => client.send(`${ch}|${typeof m === "string" ? m : JSON.stringify(m)}`);
  s.close = () => {
    clearTimeout(timer);
    client.send(`-${ch}|`);
    forget();
    setState("closed");
  };
  return s;
}

module.exports = { CLOSE_REASONS, backoff, refusal, split, connect, multiplex };
