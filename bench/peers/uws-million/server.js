// The `million` protocol of shared/BENCH.md, as a user who picks uWebSockets.js would write it:
// one board of 1,000,000 checkboxes in memory (no persistence), pages of 4,096 boxes, one pub/sub
// topic per page, a click published to its page's topic (uWS corks the writes of a handler and
// encodes a published frame once for all subscribers). Also GET /healthz, and the fan-out
// protocol of `bench/fanout.sh` (below).
// Usage: PORT=8090 node server.js   (prints "peer ready: port=<port> pid=<pid>")
//
// The npm package falls back to a ws-based imitation when its native binary does not load; a
// benchmark of that would be a benchmark of ws under another name, so this peer loads the native
// binary itself and refuses to start without it.
"use strict";
const path = require("path");

let uWS;
const binary = path.join(
  __dirname,
  "node_modules/uWebSockets.js/binaries",
  `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`,
);
try {
  uWS = require(binary);
} catch (e) {
  console.error(`uws peer: the native uWebSockets.js module did not load (${binary}): ${e.message}`);
  process.exit(1);
}

const BOXES = 1000000;
const PAGE = 4096;
const PAGES = Math.ceil(BOXES / PAGE);
const bits = new Uint8Array(BOXES / 8);
let nextSession = 1;
const body = JSON.stringify({ status: "ok" });

const app = uWS.App();
app.get("/healthz", (res) => {
  res.cork(() => res.writeHeader("content-type", "application/json").end(body));
});
app.ws("/o/million/*", {
  compression: uWS.DISABLED,
  maxPayloadLength: 16 * 1024,
  idleTimeout: 0,
  upgrade: (res, req, context) => {
    const page = Number(new URLSearchParams(req.getQuery() || "").get("page") || 0);
    if (!(page >= 0 && page < PAGES)) {
      res.writeStatus("400 Bad Request").end();
      return;
    }
    res.upgrade(
      { page, session: nextSession++ },
      req.getHeader("sec-websocket-key"),
      req.getHeader("sec-websocket-protocol"),
      req.getHeader("sec-websocket-extensions"),
      context,
    );
  },
  open: (ws) => {
    const { page, session } = ws.getUserData();
    ws.subscribe(`p${page}`);
    const slice = bits.subarray((page * PAGE) / 8, ((page + 1) * PAGE) / 8);
    ws.send(JSON.stringify({ t: "page", p: page, s: session, bits: Buffer.from(slice).toString("hex") }));
  },
  message: (ws, data) => {
    let m;
    try {
      m = JSON.parse(Buffer.from(data).toString());
    } catch {
      ws.send(JSON.stringify({ error: "a click is JSON" }));
      return;
    }
    if (m.t !== "click" || !(m.i >= 0 && m.i < BOXES)) {
      ws.send(JSON.stringify({ error: "bad click" }));
      return;
    }
    bits[m.i >> 3] ^= 1 << (m.i & 7);
    const v = (bits[m.i >> 3] >> (m.i & 7)) & 1;
    const { session } = ws.getUserData();
    app.publish(`p${Math.floor(m.i / PAGE)}`, JSON.stringify({ t: "set", u: [[m.i, v, session, m.c || 0]] }));
  },
});

// `bench/fanout.sh`'s protocol, as combd's `fanout` test app speaks it: a viewer of
// /o/fanout/<board> subscribes to topic t0; POST /o/fanout/<board>?n=N publishes N text frames
// of 40 bytes (`{"f":<i>,"p":"xx…"}`) to it in one call and answers {"sent":N}.
app.ws("/o/fanout/*", {
  compression: uWS.DISABLED,
  maxPayloadLength: 16 * 1024,
  idleTimeout: 0,
  open: (ws) => ws.subscribe("t0"),
});
app.post("/o/fanout/*", (res, req) => {
  const n = Number(new URLSearchParams(req.getQuery() || "").get("n") || 1);
  if (!(n >= 1 && n <= 64)) {
    res.cork(() => res.writeStatus("400 Bad Request").end());
    return;
  }
  for (let i = 0; i < n; i++) {
    const pad = "x".repeat(40 - 13 - String(i).length);
    app.publish("t0", `{"f":${i},"p":"${pad}"}`);
  }
  res.cork(() => res.writeHeader("content-type", "application/json").end(JSON.stringify({ sent: n })));
});

const port = Number(process.env.PORT || 8090);
app.listen("0.0.0.0", port, (token) => {
  if (!token) {
    console.error(`uws peer: could not listen on port ${port}`);
    process.exit(1);
  }
  console.log(`peer ready: port=${port} pid=${process.pid}`);
});
