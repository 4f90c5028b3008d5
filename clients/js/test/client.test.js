// Tests of combd-client: its pure parts, and the client against a live node whose address
// and tokens come from the environment (tests/js_client.rs starts the node and runs these
// with `node --experimental-websocket --test`): COMBD_URL, COMBD_TOKEN_ALICE, COMBD_TOKEN_BOB.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { backoff, connect, multiplex, refusal } from "../combd-client.js";
import { cjs } from "../build-cjs.mjs";

test("the CommonJS form is the module's, as build-cjs.mjs writes it, and require() takes it", () => {
  const source = readFileSync(new URL("../combd-client.js", import.meta.url), "utf8");
  const written = readFileSync(new URL("../combd-client.cjs", import.meta.url), "utf8");
  assert.equal(written, cjs(source), "combd-client.cjs is stale: run `node build-cjs.mjs`");
  const required = createRequire(import.meta.url)("../combd-client.cjs");
  assert.deepEqual(Object.keys(required).sort(), ["CLOSE_REASONS", "backoff", "connect", "multiplex", "refusal", "split"]);
  assert.equal(required.backoff(4, { random: () => 1 }), backoff(4, { random: () => 1 }));
});

test("the backoff doubles from 0.5 s to 30 s, jittered to between half and all of it", () => {
  assert.equal(backoff(1, { random: () => 1 }), 500);
  assert.equal(backoff(1, { random: () => 0 }), 250);
  assert.equal(backoff(4, { random: () => 1 }), 4000);
  assert.equal(backoff(20, { random: () => 1 }), 30000);
  assert.equal(backoff(20, { random: () => 0 }), 15000);
});

/** A WebSocket for tests without a node: `plan(n)` says what the n-th one does. */
function fakeSockets(plan) {
  const sockets = [];
  class Fake {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.sent = [];
      sockets.push(this);
      const does = plan(sockets.length);
      setTimeout(() => {
        if (does === "refused") {
          this.readyState = 3;
          this.onerror?.({});
          this.onclose?.({ code: 1006, reason: "" });
        } else {
          this.readyState = 1;
          this.onopen?.();
          if (does !== "silent") this.onmessage?.({ data: JSON.stringify(does) });
        }
      });
    }
    send(data) { this.sent.push(data); }
    close(code = 1000) {
      if (this.readyState === 3) return;
      this.readyState = 3;
      this.onclose?.({ code, reason: "" });
    }
  }
  return { Fake, sockets };
}

test("what is sent while the connection is not open is kept, bounded, and sent in order as the next one opens", async () => {
  // The first socket is refused (no answer: a retry), the second opens and says nothing.
  const { Fake, sockets } = fakeSockets((n) => (n === 1 ? "refused" : "silent"));
  const states = [];
  const waiters = [];
  const c = connect("/o/echo/x", {
    base: "http://127.0.0.2:9/", WebSocketImpl: Fake, random: () => 0,
    fetchImpl: async () => { throw new TypeError("fetch failed"); },
    sendBuffer: { messages: 2, bytes: 100 },
    onState: (state) => { states.push(state); waiters.forEach((w) => w()); },
  });
  assert.equal(c.send({ n: 1 }), true);
  assert.equal(c.send("two"), true);
  assert.equal(c.send("three"), false, "past sendBuffer.messages");
  assert.equal(c.buffered, 2);
  await until("open", waiters, () => c.state === "open");
  assert.deepEqual(sockets[1].sent, ['{"n":1}', "two"]);
  assert.equal(c.buffered, 0);
  // Open is not live: nothing came on this connection yet.
  assert.ok(!states.includes("live"), `${states}`);
  assert.equal(c.send("now"), true);
  assert.deepEqual(sockets[1].sent.at(-1), "now");
  sockets[1].close(1006);
  assert.equal(c.send("x".repeat(101)), false, "past sendBuffer.bytes");
  assert.equal(c.send("kept"), true);
  assert.equal(c.dropBuffered(), 1);
  c.close();
  assert.equal(c.send("after close"), false);
  // No WebSocket at all: a clear error, not "WebSocketImpl is not a constructor".
  // (null stands for a runtime with none: undefined would take the default, the global one.)
  assert.throws(() => connect("/o/echo/x", { WebSocketImpl: null, base: "http://127.0.0.2:9/" }),
    /no WebSocket.*WebSocketImpl/);
});

test("a refused upgrade's HTTP answer says the state", async () => {
  assert.equal(refusal(401).state, "unauthorized");
  assert.equal(refusal(403).state, "invalid");
  assert.equal(refusal(400).state, "invalid");
  assert.equal(refusal(400, null, "page must be below 245").why, "page must be below 245");
  assert.deepEqual(refusal(503, "3"), { state: "busy", why: "the node is busy", wait: 3000 });
  assert.equal(refusal(503, null).wait, undefined);
  assert.equal(refusal(502), null);
  assert.equal(refusal(0), null);

  // Without a node: a connection goes live and the node closes it with 1001; then no answer at
  // all, which is a restart (reconnecting), not the `refusal` option's reading of no answer.
  const { Fake, sockets } = fakeSockets((n) => (n === 1 ? { t: "page", p: 3 } : "refused"));
  const states = [];
  const attempts = [];
  const waiters = [];
  const noAnswer = async () => { throw new TypeError("fetch failed"); };
  const c = connect("/o/million/b?page=3", {
    base: "http://127.0.0.2:9/",
    WebSocketImpl: Fake,
    // While an attempt's end is being asked about, a retry asked for opens no second socket.
    fetchImpl: (...a) => { c.retryNow(); return noAnswer(...a); },
    random: () => 0,
    refusal: (status, retryAfter, error) => refusal(status, retryAfter, error) ?? { state: "busy", why: "refused" },
    onAttempt: (n) => { attempts.push([n, states.at(-1)?.state]); waiters.forEach((w) => w()); },
    onState: (state, why, info) => { states.push({ state, why, info }); waiters.forEach((w) => w()); },
  });
  assert.equal(sockets[0].url, "ws://127.0.0.2:9/o/million/b?page=3");
  await until("live", waiters, () => c.state === "live");
  assert.ok(c.send({ t: "click", i: 12305, c: 1 }));
  assert.deepEqual(sockets[0].sent, ['{"t":"click","i":12305,"c":1}']);
  sockets[0].close(1001);
  assert.deepEqual(states.at(-1).info, { code: 1001, reason: "the node is restarting", wait: 250 });
  assert.equal(states.at(-1).why, "the node is restarting; retrying in 0.3 s");
  await until("the second attempt's end", waiters, () => states.length >= 5);
  assert.deepEqual(states.map((s) => s.state), ["connecting", "open", "live", "reconnecting", "reconnecting"]);
  assert.deepEqual(states[4].info, { status: 0, reason: "the node is restarting", wait: 500 });
  assert.deepEqual(attempts, [[1, "connecting"], [2, "reconnecting"]]);
  assert.equal(sockets.length, 2);
  c.retryNow(); // while a retry waits: now
  assert.equal(sockets.length, 3);
  assert.equal(c.attempts, 3);
  assert.equal(c.state, "reconnecting");
  c.close();

  // No answer from a node that did not say it restarts: what `refusal` makes of it (busy here).
  const fresh = fakeSockets(() => "refused");
  const busy = [];
  const b = connect("/o/million/b", {
    base: "http://127.0.0.2:9/", WebSocketImpl: fresh.Fake, fetchImpl: noAnswer, random: () => 0,
    refusal: (status) => refusal(status) ?? { state: "busy", why: "refused" },
    onState: (state, why, info) => { busy.push({ state, why, info }); waiters.forEach((w) => w()); },
  });
  await until("busy", waiters, () => b.state === "busy");
  assert.deepEqual(busy.at(-1).info, { status: 0, reason: "refused", wait: 250 });
  b.close();

  // A 400 with the node's reason: invalid, with that reason, and not retried.
  const bad = fakeSockets(() => "refused");
  const answer400 = async () => new Response('{"error":"page must be below 245"}', { status: 400 });
  const seen = [];
  const d = connect("/o/million/b?page=245", {
    base: "http://127.0.0.2:9/", WebSocketImpl: bad.Fake, fetchImpl: answer400,
    onState: (state, why, info) => { seen.push({ state, why, info }); waiters.forEach((w) => w()); },
  });
  await until("invalid", waiters, () => d.state === "invalid");
  assert.deepEqual(seen.at(-1), { state: "invalid", why: "page must be below 245", info: { status: 400, error: "page must be below 245" } });
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(bad.sockets.length, 1);
  d.retryNow(); // as before: a retry asked for is made
  await until("invalid again", waiters, () => seen.filter((s) => s.state === "invalid").length === 2);
  assert.equal(bad.sockets.length, 2);
  d.close();

  // A session whose token expired is closed 3000: unauthorized, not retried until a new token.
  const expiring = fakeSockets(() => ({ t: "hello" }));
  const e = connect("/o/chat/r", {
    base: "http://127.0.0.2:9/", WebSocketImpl: expiring.Fake, token: "old", random: () => 0,
    onState: () => waiters.forEach((w) => w()),
  });
  await until("live with the old token", waiters, () => e.state === "live");
  expiring.sockets[0].close(3000);
  assert.equal(e.state, "unauthorized");
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(expiring.sockets.length, 1, "not retried with the expired token");
  e.setToken("new");
  await until("live with the new token", waiters, () => e.state === "live");
  assert.equal(expiring.sockets.length, 2);
  e.close();
});

const URL_ = process.env.COMBD_URL;
const live = { skip: URL_ ? false : "COMBD_URL is not set (tests/js_client.rs sets it)" };

/** Resolves when `check()` holds, polled on every state change and message. */
function until(what, events, check, ms = 10000) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
    const tick = () => {
      if (check()) {
        clearTimeout(t);
        resolve();
      }
    };
    events.push(tick);
    tick();
  });
}

const RUN = `${process.pid}-${Date.now()}`; // rooms of this run alone
const opened = [];
process.on("exit", () => opened.forEach((c) => c.close()));

function client(room, token, extra = {}) {
  const seen = { states: [], messages: [], waiters: [] };
  const poke = () => seen.waiters.forEach((w) => w());
  const c = connect(`/o/chat/${room}-${RUN}`, {
    base: URL_,
    token,
    numbered: true,
    onMessage: (m) => {
      seen.messages.push(m);
      poke();
    },
    onPresence: poke,
    onState: (s) => { seen.states.push(s); poke(); },
    ...extra,
  });
  opened.push(c);
  return { c, seen };
}

test.afterEach(() => opened.splice(0).forEach((c) => c.close()));

test("a valid token goes live and its messages come back", live, async () => {
  const { c, seen } = client("js-live", process.env.COMBD_TOKEN_ALICE);
  await until("live", seen.waiters, () => c.state === "live");
  assert.equal(seen.messages[0].t, "hello");
  assert.equal(seen.messages[0].me, "alice");
  assert.ok(c.send({ t: "say", text: "from node" }));
  await until("the echo", seen.waiters, () => seen.messages.some((m) => m.t === "msg" && m.text === "from node"));
  c.close();
  assert.equal(c.state, "closed");
});

test("a refused token is unauthorized, and not retried", live, async () => {
  const { c, seen } = client("js-refused", "not-a-token");
  await until("unauthorized", seen.waiters, () => c.state === "unauthorized");
  await new Promise((r) => setTimeout(r, 1200));
  assert.equal(seen.states.filter((s) => s === "connecting").length, 1, `${seen.states}`);
  assert.equal(c.lastClose.code, 1006);
  c.close();
});

test("a dropped connection resumes from its place: none lost, none twice, no second hello", live, async () => {
  const sockets = [];
  class Kept extends WebSocket {
    constructor(...a) { super(...a); sockets.push(this); }
  }
  const alice = client("js-resume", process.env.COMBD_TOKEN_ALICE, { WebSocketImpl: Kept, random: () => 0 });
  const bob = client("js-resume", process.env.COMBD_TOKEN_BOB);
  // Each waits on its own client's events (one's check is not run again on the other's).
  await until("alice live", alice.seen.waiters, () => alice.c.state === "live");
  await until("bob live", bob.seen.waiters, () => bob.c.state === "live");
  bob.c.send({ t: "say", text: "one" });
  await until("one", alice.seen.waiters, () => alice.seen.messages.some((m) => m.text === "one"));
  sockets[0].close(4000); // the link drops
  await until("reconnecting", alice.seen.waiters, () => alice.c.state === "reconnecting");
  bob.c.send({ t: "say", text: "two" });
  bob.c.send({ t: "say", text: "three" });
  await until("resumed", alice.seen.waiters, () => sockets.length === 2 && alice.c.state === "live");
  await until("three", alice.seen.waiters, () => alice.seen.messages.some((m) => m.text === "three"));
  // The resumed connection got what it missed from the room's log, in order, once each, and
  // no hello: the client's place made it live.
  const msgs = alice.seen.messages.filter((m) => m.t === "msg");
  assert.deepEqual(msgs.map((m) => m.text), ["one", "two", "three"]);
  assert.deepEqual(msgs.map((m) => m.id), [1, 2, 3]);
  assert.equal(alice.seen.messages.filter((m) => m.t === "hello").length, 1, "one hello, on the first connection");
  alice.c.close();
  bob.c.close();
});

test("a room's presence: each user once whatever its tabs, joins and leaves as they come", live, async () => {
  const alice = client("js-presence", process.env.COMBD_TOKEN_ALICE);
  await until("alice alone", alice.seen.waiters, () => alice.c.presence.has("alice"));
  assert.deepEqual([...alice.c.presence.keys()], ["alice"]);
  assert.equal(alice.c.presence.get("alice").verified, true);
  const bob = client("js-presence", process.env.COMBD_TOKEN_BOB);
  const bob2 = client("js-presence", process.env.COMBD_TOKEN_BOB);
  await until("bob on two devices", alice.seen.waiters, () => alice.c.presence.get("bob")?.devices === 2);
  await until("bob sees alice", bob.seen.waiters, () => bob.c.presence.has("alice"));
  bob2.c.close();
  await until("bob on one", alice.seen.waiters, () => alice.c.presence.get("bob")?.devices === 1);
  bob.c.close();
  await until("bob gone", alice.seen.waiters, () => !alice.c.presence.has("bob"));
  assert.deepEqual([...alice.c.presence.keys()], ["alice"]);
  alice.c.close();
});

test("a numbered viewer that drops its link gets every broadcast it missed, once, in order", live, async () => {
  const sockets = [];
  class Kept extends WebSocket {
    constructor(...a) { super(...a); sockets.push(this); }
  }
  const board = `/o/million/js-numbered-${RUN}?page=0`;
  const seen = { got: [], positions: [], waiters: [] };
  const poke = () => seen.waiters.forEach((w) => w());
  const viewer = connect(board, {
    base: URL_,
    numbered: true,
    WebSocketImpl: Kept,
    random: () => 0,
    onPosition: (epoch, last, why) => { seen.positions.push(why); poke(); },
    onMessage: (m, { seq }) => { if (seq > 0) seen.got.push([seq, JSON.stringify(m)]); poke(); },
    onState: poke,
  });
  opened.push(viewer);
  // A plain viewer that clicks sees what was committed, in order.
  const clicker = new WebSocket(new URL(board, URL_.replace("http", "ws")));
  const committed = [];
  const clicked = { waiters: [] };
  clicker.onmessage = (e) => {
    const m = JSON.parse(e.data);
    if (m.t === "set") committed.push(JSON.stringify(m));
    clicked.waiters.forEach((w) => w());
  };
  await new Promise((r) => { clicker.onopen = r; });
  await until("the viewer live", seen.waiters, () => viewer.state === "live");
  const click = async (from, n) => {
    const updates = () => committed.reduce((sum, f) => sum + JSON.parse(f).u.length, 0);
    const want = updates() + n;
    for (let i = from; i < from + n; i += 1) clicker.send(JSON.stringify({ t: "click", i, c: i }));
    await until("the clicks", clicked.waiters, () => updates() >= want);
  };
  await click(0, 20);
  await until("live frames", seen.waiters, () => seen.got.length === committed.length);
  sockets[0].close(4000); // the link drops
  await until("reconnecting", seen.waiters, () => viewer.state === "reconnecting");
  await click(20, 30);
  await until("resumed", seen.waiters, () => sockets.length === 2 && seen.got.length === committed.length);
  assert.deepEqual(seen.got.map(([, m]) => m), committed, "every broadcast once, in order");
  assert.deepEqual(seen.got.map(([s]) => s), committed.map((_, i) => i + 1), "numbered 1, 2, …");
  assert.ok(seen.positions.includes("resumed"), `${seen.positions}`);
  assert.ok(sockets[1].url.includes(`combd_after=${viewer.place.epoch}.`), sockets[1].url);
  clicker.close();
  viewer.close();
});

test("one socket carries many subscriptions, each resumed from its own place", live, async () => {
  const sockets = [];
  class Kept extends WebSocket {
    constructor(...a) { super(...a); sockets.push(this); }
  }
  const seen = { a: [], b: [], waiters: [] };
  const poke = () => seen.waiters.forEach((w) => w());
  const hub = multiplex({ base: URL_, token: process.env.COMBD_TOKEN_ALICE, WebSocketImpl: Kept, random: () => 0 });
  opened.push(hub);
  const sub = (room, into) => hub.subscribe("chat", `${room}-${RUN}`, {
    numbered: true,
    onMessage: (m) => { into.push(m); poke(); },
    onPresence: poke,
    onState: poke,
  });
  const a = sub("js-mux-a", seen.a);
  const b = sub("js-mux-b", seen.b);
  await until("both live", seen.waiters, () => a.state === "live" && b.state === "live");
  await until("both hellos", seen.waiters, () => seen.a.length > 0 && seen.b.length > 0);
  const bobA = client("js-mux-a", process.env.COMBD_TOKEN_BOB);
  const bobB = client("js-mux-b", process.env.COMBD_TOKEN_BOB);
  await until("bob in a", seen.waiters, () => a.presence.has("bob") && a.presence.has("alice"));
  await until("bob in b", seen.waiters, () => b.presence.has("bob"));
  a.send({ t: "say", text: "a1" });
  b.send({ t: "say", text: "b1" });
  const texts = (got) => got.filter((m) => m.t === "msg").map((m) => m.text);
  await until("a1 and b1", seen.waiters, () => texts(seen.a).includes("a1") && texts(seen.b).includes("b1"));
  sockets[0].close(4000); // the link drops: both subscriptions with it
  await until("reconnecting", seen.waiters, () => a.state === "reconnecting" && b.state === "reconnecting");
  bobA.c.send({ t: "say", text: "a2" });
  bobA.c.send({ t: "say", text: "a3" });
  bobB.c.send({ t: "say", text: "b2" });
  await until("resumed", seen.waiters, () => texts(seen.a).includes("a3") && texts(seen.b).includes("b2"), 15000);
  assert.equal(sockets.length, 2, "one socket for both subscriptions, once again after the drop");
  assert.deepEqual(texts(seen.a), ["a1", "a2", "a3"]);
  assert.deepEqual(texts(seen.b), ["b1", "b2"]);
  assert.equal(seen.a.filter((m) => m.t === "hello").length, 1, "no second hello: resumed from its place");
  assert.equal(seen.b.filter((m) => m.t === "hello").length, 1);
  b.close();
  await until("bob's b sees alice leave", bobB.seen.waiters, () => !bobB.c.presence.has("alice"));
  assert.ok(a.state === "live" && b.state === "closed");
  hub.close();
});
