// Run against a live `memstream serve` by tests/e2e/test_typescript_client.py, which sets
// MEMSTREAM_TEST_URL, MEMSTREAM_TEST_KEY (a writer of tenant MEMSTREAM_TEST_TENANT) and
// MEMSTREAM_TEST_OTHER_TENANT.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { MemstreamClient, MemstreamError } from "../src/index.js";

const url = process.env.MEMSTREAM_TEST_URL;
const key = process.env.MEMSTREAM_TEST_KEY;
const live = { skip: !url && "MEMSTREAM_TEST_URL is not set" };

test("add, wait, search, forget, search again", live, async () => {
  const client = new MemstreamClient({ url, apiKey: key });
  const conversation = `ts-${randomUUID()}`;
  const added = await client.add([
    { conversation_id: conversation, speaker: "Ada", text: "My sister Grace breeds Icelandic horses near Akureyri." },
    { conversation_id: conversation, speaker: "Bo", text: "We should visit her farm in the summer." },
  ]);
  assert.equal(added.accepted, 2);
  assert.equal(await client.wait(added.positions, 120), true);

  const found = await client.search("Who breeds horses?", { conversation_id: conversation, strategy: "bm25" });
  const turns = found.evidence.flatMap((e) => e.turns);
  assert.ok(turns.some((t) => t.text.includes("Icelandic horses")), JSON.stringify(found.evidence));
  for (const t of turns) {
    assert.equal(typeof t.event_id, "string");
    assert.equal(typeof t.partition, "number");
  }
  for (const e of found.evidence) {
    assert.equal(typeof e.score, "number");
    assert.ok(["primary", "bridge", "neighbour", "fill"].includes(e.role), e.role);
  }
  const one = await client.search("Who breeds horses?", { conversation_id: conversation, strategy: "bm25",
    max_turns: 1 });
  assert.equal(new Set(one.evidence.flatMap((e) => e.turns.map((t) => t.event_id))).size, 1);

  const forgotten = await client.forget({ conversation_id: conversation });
  assert.equal(forgotten.status, "requested");
  assert.equal(await client.wait(forgotten.positions, 120), true);
  const after = await client.search("Who breeds horses?", { conversation_id: conversation, strategy: "bm25" });
  assert.equal(after.evidence.flatMap((e) => e.turns).filter((t) => t.text.includes("Icelandic")).length, 0);
});

test("refusals come back as MemstreamError with the API's code", live, async () => {
  const bad = new MemstreamClient({ url, apiKey: "ms_not_a_real_key", attempts: 1 });
  await assert.rejects(bad.search("anything"), (e: unknown) => e instanceof MemstreamError && e.status === 401);
  const client = new MemstreamClient({ url, apiKey: key, attempts: 1 });
  await assert.rejects(
    client.search("anything", { tenant_id: process.env.MEMSTREAM_TEST_OTHER_TENANT }),
    (e: unknown) => e instanceof MemstreamError && e.status === 403 && e.code !== null,
  );
  await assert.rejects(client.forget({ session_id: "s1" }),
    (e: unknown) => e instanceof MemstreamError && e.status >= 400 && e.status < 500);
});
