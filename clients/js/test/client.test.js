// Tests of combd-client: its pure parts, and the client against a live node whose address
// and tokens come from the environment (tests/js_client.rs starts the node and runs these
// with `node --experimental-websocket --test`): COMBD_URL, COMBD_TOKEN_ALICE, COMBD_TOKEN_BOB.
import { test } from "node:test";
import assert from "node:assert/strict";
import { backoff, connect, refusal } from "../combd-client.js";

test("the backoff doubles from 0.5 s to 30 s, jittered to between half and all of it", () => {
  assert.equal(backoff(1, { random: () => 1 }), 500);
  assert.equal(backoff(1, { random: () => 0 }), 250);
  assert.equal(backoff(4, { random: () => 1 }), 4000);
  assert.equal(backoff(20, { random: () => 1 }), 30000);
  assert.equal(backoff(20, { random: () => 0 }), 15000);
});

test("a refused upgrade's HTTP answer says the state", () => {
  assert.equal(refusal(401).state, "unauthorized");
  assert.equal(refusal(403).state, "invalid");
  assert.equal(refusal(400).state, "invalid");
  assert.deepEqual(refusal(503, "3"), { state: "busy", why: "the node is busy", wait: 3000 });
  assert.equal(refusal(503, null).wait, undefined);
  assert.equal(refusal(502), null);
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
  let last = 0;
  const c = connect(`/o/chat/${room}-${RUN}`, {
    base: URL_,
    token,
    query: () => ({ after: String(last) }),
    onMessage: (m) => {
      if (m.t === "hello") m.history.forEach((h) => { last = Math.max(last, h.id); });
      if (m.t === "msg") last = Math.max(last, m.id);
      seen.messages.push(m);
      poke();
    },
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

test("a dropped connection resumes after the last message: none lost, none twice", live, async () => {
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
  await until("three", alice.seen.waiters, () =>
    alice.seen.messages.some((m) => m.text === "three" || (m.history ?? []).some((h) => h.text === "three")));
  // As a page shows them: each message once, by id (what reached the new session before its
  // hello is in the hello too).
  let shown = 0;
  const texts = [];
  for (const m of alice.seen.messages.flatMap((m) => (m.t === "hello" ? m.history : m.t === "msg" ? [m] : []))) {
    if (m.id > shown) {
      shown = m.id;
      texts.push(m.text);
    }
  }
  assert.deepEqual(texts, ["one", "two", "three"]);
  const ids = alice.seen.messages.filter((m) => m.t === "hello").flatMap((h) => h.history.map((m) => m.id));
  assert.equal(new Set(ids).size, ids.length, "no hello repeats a message");
  alice.c.close();
  bob.c.close();
});
