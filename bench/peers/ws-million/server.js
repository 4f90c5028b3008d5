// The `million` protocol of shared/BENCH.md, as a user would write it on Node.js with the ws
// package: one board of 1,000,000 checkboxes in memory (no persistence, no batching), pages of
// 4,096 boxes, clicks broadcast to the viewers of the box's page. Also GET /healthz.
// Usage: PORT=8090 node server.js   (prints "peer ready: port=<port> pid=<pid>")
"use strict";
const http = require("http");
const { WebSocketServer } = require("ws");

const BOXES = 1000000;
const PAGE = 4096;
const PAGES = Math.ceil(BOXES / PAGE);
const bits = new Uint8Array(BOXES / 8);
const viewers = new Map(); // page -> Set of sockets
let nextSession = 1;

const body = JSON.stringify({ status: "ok" });
const server = http.createServer((req, res) => {
  if (req.url === "/healthz") {
    res.writeHead(200, { "content-type": "application/json", "content-length": body.length });
    res.end(body);
  } else {
    res.writeHead(404);
    res.end();
  }
});

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
server.on("upgrade", (req, socket, head) => {
  const url = new URL(req.url, "http://x");
  const page = Number(url.searchParams.get("page") || 0);
  if (!url.pathname.startsWith("/o/million/") || !(page >= 0 && page < PAGES)) {
    socket.end("HTTP/1.1 400 Bad Request\r\n\r\n");
    return;
  }
  wss.handleUpgrade(req, socket, head, (ws) => {
    const session = nextSession++;
    if (!viewers.has(page)) viewers.set(page, new Set());
    viewers.get(page).add(ws);
    const slice = bits.subarray((page * PAGE) / 8, ((page + 1) * PAGE) / 8);
    ws.send(JSON.stringify({ t: "page", p: page, s: session, bits: Buffer.from(slice).toString("hex") }));
    ws.on("message", (data) => {
      let m;
      try {
        m = JSON.parse(data);
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
      const msg = JSON.stringify({ t: "set", u: [[m.i, v, session, m.c || 0]] });
      for (const peer of viewers.get(Math.floor(m.i / PAGE)) || []) peer.send(msg);
    });
    ws.on("close", () => viewers.get(page).delete(ws));
  });
});

const port = Number(process.env.PORT || 8090);
server.listen(port, "0.0.0.0", () => console.log(`peer ready: port=${port} pid=${process.pid}`));
