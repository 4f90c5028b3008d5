// combd-client: a WebSocket to a combd object that stays connected, says what state it is in,
// and resumes where it left off. An ES module with no dependencies, for browsers and for
// Node.js (22, or 20 with --experimental-websocket).
//
//   import { connect } from "/combd-client.js";
//   const room = connect("/o/chat/lobby", {
//     token,                                   // offered as the subprotocol combd.bearer.<token>
//     query: () => ({ after: String(last) }),  // asked again at every (re)connect
//     onMessage: (m) => { ... },               // every message, parsed as JSON when it is JSON
//     onState: (state, why) => { ... },
//   });
//   room.send({ t: "say", text: "hi" });
//
// States: connecting, live (a first message came on this connection), reconnecting (waiting
// out a jittered backoff: 0.5 s doubling to 30 s, back to 0.5 s once a connection delivers a
// message), busy (the node is full or asked to try later: 503 with retry-after, 1013),
// invalid (the request itself is wrong: 400, 404; no retry), unauthorized (401: the token is
// missing, expired or refused; no retry until a new token is given with setToken), closed
// (close() was called). Close codes honoured: 1001 (the node restarts: reconnect), 1008 (too
// many messages, or reading too slowly: wait longer), 1013 (try again later: busy).

const CLOSE_REASONS = {
  1000: "closed",
  1001: "the node is restarting",
  1006: "connection lost",
  1008: "too many messages, or reading too slowly",
  1009: "a message too big",
  1011: "node error",
  1013: "the node asked to try again later",
};

/** Backoff: `min` doubling to `max`, each wait jittered to between half and all of it. */
export function backoff(failures, { min = 500, max = 30000, random = Math.random } = {}) {
  const full = Math.min(max, min * 2 ** Math.max(0, failures - 1));
  return full * (0.5 + random() / 2);
}

/** The state a refused upgrade means, from the plain HTTP answer to the same request. */
export function refusal(status, retryAfter) {
  if (status === 401) return { state: "unauthorized", why: "the token was refused" };
  if (status === 403) return { state: "invalid", why: "this page's origin is not allowed" };
  if (status === 400 || status === 404) return { state: "invalid", why: `the node answered ${status}` };
  if (status === 503 || status === 429) {
    const s = Number.parseInt(retryAfter ?? "", 10);
    return { state: "busy", why: "the node is busy", wait: Number.isFinite(s) && s > 0 ? s * 1000 : undefined };
  }
  return null;
}

/**
 * Connects to `path` (an object's URL path, or a whole ws:// or wss:// URL) and keeps the
 * connection up. Returns { send, close, retryNow, setToken, state, lastClose }.
 */
export function connect(path, options = {}) {
  const {
    token: firstToken,
    protocols = [],
    query = () => ({}),
    onMessage = () => {},
    onState = () => {},
    base = globalThis.location ? globalThis.location.href : undefined,
    WebSocketImpl = globalThis.WebSocket,
    fetchImpl = globalThis.fetch,
    random = Math.random,
  } = options;
  let token = firstToken;
  let ws = null;
  let failures = 0;
  let timer = null;
  let stopped = false;
  const client = { state: "connecting", lastClose: null };

  function setState(state, why = "") {
    client.state = state;
    onState(state, why);
  }

  function url(scheme) {
    const u = new URL(path, base);
    u.protocol = scheme === "ws" ? (u.protocol === "https:" || u.protocol === "wss:" ? "wss:" : "ws:")
      : (u.protocol === "wss:" || u.protocol === "https:" ? "https:" : "http:");
    for (const [k, v] of Object.entries(query() ?? {})) u.searchParams.set(k, v);
    return u.toString();
  }

  function wait(ms, state, why) {
    clearTimeout(timer);
    setState(state, `${why}; retrying in ${(ms / 1000).toFixed(1)} s`);
    timer = setTimeout(open, ms);
  }

  function retry(why, state = "reconnecting", extra = 0) {
    if (stopped) return;
    failures += 1;
    wait(backoff(failures, { random }) + extra, state, why);
  }

  // A WebSocket refused before it opened says nothing about why: ask the same URL over HTTP.
  async function probe() {
    try {
      const headers = token ? { authorization: `Bearer ${token}` } : {};
      const r = await fetchImpl(url("http"), { headers });
      return refusal(r.status, r.headers.get("retry-after"));
    } catch {
      return null;
    }
  }

  function open() {
    if (stopped) return;
    clearTimeout(timer);
    if (client.state !== "reconnecting" && client.state !== "busy") setState("connecting");
    const offered = [...protocols];
    if (token) offered.push("combd", `combd.bearer.${token}`);
    let opened = false;
    let greeted = false;
    ws = new WebSocketImpl(url("ws"), offered);
    ws.onopen = () => { opened = true; };
    ws.onmessage = (e) => {
      let m = e.data;
      if (typeof m === "string") {
        try { m = JSON.parse(m); } catch { /* not JSON: passed on as text */ }
      }
      if (!greeted) {
        greeted = true;
        failures = 0; // this connection delivered: the next loss starts the backoff again
        setState("live");
      }
      onMessage(m);
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
      if (stopped) return;
      const why = CLOSE_REASONS[e.code] ?? `closed (${e.code})`;
      if (!opened) {
        const r = await probe();
        if (r && (r.state === "unauthorized" || r.state === "invalid")) {
          setState(r.state, r.why);
          return;
        }
        if (r && r.state === "busy") {
          failures += 1;
          wait(r.wait ?? backoff(failures, { random }), "busy", r.why);
          return;
        }
        retry("cannot connect");
        return;
      }
      if (e.code === 1013) retry(why, "busy");
      else if (e.code === 1008) retry(why, "reconnecting", 5000);
      else retry(why);
    };
  }

  client.send = (message) => {
    if (!ws || ws.readyState !== 1) return false;
    ws.send(typeof message === "string" ? message : JSON.stringify(message));
    return true;
  };
  client.close = () => {
    stopped = true;
    clearTimeout(timer);
    if (ws) ws.close(1000);
    setState("closed");
  };
  client.retryNow = () => {
    if (stopped || client.state === "live" || client.state === "connecting") return;
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
