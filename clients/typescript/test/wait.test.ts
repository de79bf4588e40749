// `wait` against a live `memstream serve` (the env vars of client.test.ts) and, where the point is the requests
// the client sends, against a stand-in fetch.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { MemstreamClient, MemstreamError, WaitTimeout } from "../src/index.js";

const url = process.env.MEMSTREAM_TEST_URL;
const key = process.env.MEMSTREAM_TEST_KEY;
const live = { skip: !url && "MEMSTREAM_TEST_URL is not set" };

async function added(): Promise<Record<string, number>> {
  const turn = { conversation_id: `ts-wait-${randomUUID()}`, speaker: "Ada", text: "A turn to wait for." };
  const result = await new MemstreamClient({ url, apiKey: key }).add(turn);
  assert.equal(result.accepted, 1);
  return result.positions;
}

test("a wait longer than the HTTP timeout ends as WaitTimeout, once", live, async () => {
  const client = new MemstreamClient({ url, apiKey: key, timeoutMs: 2_000 });
  const beyond = Object.fromEntries(Object.keys(await added()).map((p) => [p, 1_000_000_000]));
  const started = performance.now();
  await assert.rejects(client.wait(beyond, 5), (e: unknown) => {
    assert.ok(e instanceof WaitTimeout, `not a WaitTimeout: ${String(e)}`);
    assert.ok(e instanceof MemstreamError);
    assert.equal(e.status, 504);
    assert.equal(e.code, "timeout");
    return true;
  });
  // One request of 5 s: the same 504 retried would take 25 s.
  assert.ok(performance.now() - started < 15_000, `took ${performance.now() - started} ms`);
});

test("a wait longer than the HTTP timeout that is reached returns true", live, async () => {
  const client = new MemstreamClient({ url, apiKey: key, timeoutMs: 2_000 });
  assert.equal(await client.wait(await added(), 60), true);
});

type Sent = { timeout_seconds: number };

function standIn(answers: Array<[number, unknown]>, sent: Sent[]): typeof fetch {
  return async (_input, init) => {
    sent.push(JSON.parse(String(init?.body)) as Sent);
    const [status, body] = answers.shift() ?? [500, { error: { code: "internal", message: "no more answers" } }];
    return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
  };
}

const timedOut: [number, unknown] = [504, { error: { code: "timeout", message: "views did not reach the positions" } }];

test("a wait longer than the API's 300 s is requests of at most 300 s, until one is reached", async () => {
  const sent: Sent[] = [];
  const client = new MemstreamClient({ url: "http://memstream.invalid", fetch: standIn([timedOut, timedOut,
    [200, { caught_up: true }]], sent) });
  assert.equal(await client.wait({ 0: 7 }, 700), true);
  assert.equal(sent.length, 3);
  for (const body of sent) assert.ok(body.timeout_seconds > 299 && body.timeout_seconds <= 300, JSON.stringify(sent));
});

test("a wait of a fraction of a second is one request of that time", async () => {
  const sent: Sent[] = [];
  const client = new MemstreamClient({ url: "http://memstream.invalid", attempts: 1, timeoutMs: 1_000.5,
    fetch: standIn([[200, { caught_up: true }]], sent) });
  assert.equal(await client.wait({ 0: 7 }, 2.5), true);
  assert.ok(sent.length === 1 && sent[0]!.timeout_seconds > 2 && sent[0]!.timeout_seconds <= 2.5, JSON.stringify(sent));
});

test("a wait that ran out is not retried; a proxy's 504 is not a WaitTimeout", async () => {
  const sent: Sent[] = [];
  const client = new MemstreamClient({ url: "http://memstream.invalid", fetch: standIn([timedOut,
    [504, "<html>Gateway Time-out</html>"]], sent) });
  await assert.rejects(client.wait({ 0: 7 }, 0), WaitTimeout);
  assert.deepEqual(sent, [{ positions: { 0: 7 }, timeout_seconds: 0 }]);
  await assert.rejects(client.wait({ 0: 7 }, 0), (e: unknown) =>
    e instanceof MemstreamError && !(e instanceof WaitTimeout) && e.status === 504);
  await assert.rejects(client.wait({ 0: 7 }, -1), RangeError);
});
