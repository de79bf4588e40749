"""Programs written to Mem0's documented usage — its metadata-filtering and async-memory pages and
its platform quickstart and async-client pages — run against a live `memstream serve` with only
their import changed (`from mem0 import …` → `from memstream_client.compat.mem0 import …`), then
what the Mem0 surface promises beyond them: stored metadata and ids returned as given, scores from
the evidence, exact deletes, the platform client's options and pages. (Mem0's own quick start is
in test_clients.py.)

The documented calls are kept; where a page still passes `user_id=` to `search` or `get_all`,
which mem0ai 2.2.1 itself refuses ("Use filters={'user_id': '...'} instead"), the id is in
`filters`. Each program has users of its own: the server is shared by the session."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from memstream_client import Client, NotFound
from memstream_client.compat.mem0 import AsyncMemoryClient, Memory, MemoryClient, NotSupported, ValidationError

pytestmark = pytest.mark.e2e
MEM0, OURS = "from mem0 import", "from memstream_client.compat.mem0 import"


def run_program(served, tmp_path, source: str) -> str:
    """`source` with only its Mem0 import changed, run as its own process; its stdout."""
    program = source.replace(MEM0, OURS)
    assert [a for a in source.splitlines() if a not in program.splitlines()] == [
        line for line in source.splitlines() if line.startswith(MEM0)], "only the import may differ"
    path = tmp_path / "program.py"
    path.write_text(program)
    env = {**os.environ, "MEMSTREAM_URL": served.url, "MEMSTREAM_API_KEY": served.keys["writer"]}
    out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# -- the open-source Memory: metadata filtering -------------------------------------------------------
METADATA_FILTERING = '''
from mem0 import Memory

m = Memory()

for text, metadata in [
    ("The weekly meeting moved to Monday at ten.", {"category": "work", "priority": 8, "status": "open",
                                                    "title": "Weekly meeting"}),
    ("Flights to Porto are booked for the conference.", {"category": "travel", "priority": 6,
                                                         "status": "completed", "title": "Porto trip"}),
    ("The ramen place on Rua Augusta is the best.", {"category": "food", "priority": 3, "status": "open",
                                                     "title": "Ramen IMPORTANT"}),
    ("The old gym membership was cancelled.", {"category": "archived", "priority": 1, "status": "deleted"}),
]:
    m.add(text, user_id="filter-alice", metadata=metadata)


def show(label, found):
    print(label, sorted(r["metadata"]["category"] for r in found["results"]))


# Metadata selectors
show("simple", m.search("What are my preferences?", filters={"user_id": "filter-alice", "category": "food"}))
# Comparison operators
show("comparison", m.search("recent activities", filters={"user_id": "filter-alice", "priority": {"gte": 5},
                                                          "status": {"ne": "completed"}}))
# List-based operators
show("lists", m.search("multi-category search", filters={
    "user_id": "filter-alice", "category": {"in": ["food", "travel", "entertainment"]},
    "status": {"nin": ["deleted", "archived"]}}))
# String operators
show("strings", m.search("content search", filters={"user_id": "filter-alice", "title": {"contains": "meeting"}}))
show("istrings", m.search("content search", filters={"user_id": "filter-alice",
                                                     "title": {"icontains": "important"}}))
# Wildcard matching
show("wildcard", m.search("all with a title", filters={"user_id": "filter-alice", "title": "*"}))
# Logical combinations
show("and", m.search("complex query", filters={"user_id": "filter-alice", "AND": [
    {"category": "work"}, {"priority": {"gte": 7}}, {"status": {"ne": "completed"}}]}))
show("or", m.search("flexible query", filters={"user_id": "filter-alice", "OR": [
    {"category": "travel"}, {"priority": {"gte": 8}}]}))
show("not", m.search("exclusion query", filters={"user_id": "filter-alice", "NOT": [
    {"category": "archived"}, {"status": "deleted"}]}))
show("nested", m.search("advanced query", filters={"user_id": "filter-alice", "AND": [
    {"OR": [{"category": "work"}, {"category": "food"}]}, {"priority": {"gte": 5}},
    {"NOT": [{"status": "archived"}]}]}))
show("get_all", m.get_all(filters={"user_id": "filter-alice", "priority": {"lt": 5}}))
# Handle invalid operators
try:
    m.search("test query", filters={"user_id": "filter-alice", "invalid_operator": {"unknown": "value"}})
except ValueError as e:
    print(f"Filter error: {e}")
'''


def test_mem0s_metadata_filtering_runs_with_only_its_import_changed(served, tmp_path):
    lines = run_program(served, tmp_path, METADATA_FILTERING).splitlines()
    assert lines[:-1] == [
        "simple ['food']", "comparison ['work']", "lists ['food', 'travel']", "strings ['work']", "istrings ['food']",
        "wildcard ['food', 'travel', 'work']", "and ['work']", "or ['travel', 'work']",
        "not ['food', 'travel', 'work']",
        "nested ['work']", "get_all ['archived', 'food']"]
    assert lines[-1].startswith("Filter error:") and "Unsupported metadata filter operator: unknown" in lines[-1]


# -- the open-source AsyncMemory ------------------------------------------------------------------
ASYNC_MEMORY = '''
import asyncio
from mem0 import AsyncMemory

memory = AsyncMemory()


async def main():
    await asyncio.gather(*(memory.add(messages=[{"role": "user", "content": f"I enjoy {hobby} on weekends."}],
                                      user_id="async-alice") for hobby in ("hiking", "reading", "cooking")))
    await memory.add(
        messages=[
            {"role": "user", "content": "I'm travelling to SF"},
            {"role": "assistant", "content": "That's great to hear!"}
        ],
        user_id="async-alice"
    )
    found = await memory.search(query="Where am I travelling?", filters={"user_id": "async-alice"})
    print("search:", found["results"][0]["memory"])
    memories = await memory.get_all(filters={"user_id": "async-alice"})
    print("get_all:", len(memories["results"]))
    memory_id = next(r["id"] for r in memories["results"] if r["memory"] == "I'm travelling to SF")
    print("get:", (await memory.get(memory_id=memory_id))["memory"])
    await memory.update(memory_id=memory_id, data="I'm travelling to Seattle")
    print("history:", [h["event"] for h in await memory.history(memory_id=memory_id)])
    await memory.delete(memory_id=memory_id)
    print("deleted:", await memory.get(memory_id=memory_id))
    await memory.delete_all(user_id="async-alice")
    print("left:", (await memory.get_all(filters={"user_id": "async-alice"}))["results"])


asyncio.run(main())
'''


def test_mem0s_async_memory_runs_with_only_its_import_changed(served, tmp_path):
    assert run_program(served, tmp_path, ASYNC_MEMORY).splitlines() == [
        "search: I'm travelling to SF", "get_all: 5", "get: I'm travelling to SF", "history: ['ADD', 'UPDATE']",
        "deleted: None", "left: []"]


# -- the platform clients -----------------------------------------------------------------------------
PLATFORM_QUICKSTART = '''
from mem0 import MemoryClient

client = MemoryClient()

messages = [
    {"role": "user", "content": "I'm a vegetarian and allergic to nuts."},
    {"role": "assistant", "content": "Got it! I'll remember your dietary preferences."}
]
client.add(messages, user_id="user123")

results = client.search("What are my dietary restrictions?", filters={"user_id": "user123"})
print(results)
'''

ASYNC_CLIENT = '''
import asyncio
from mem0 import AsyncMemoryClient

client = AsyncMemoryClient()


async def main():
    messages = [
        {"role": "user", "content": "Alice loves playing badminton"},
        {"role": "assistant", "content": "That's great! Alice is a fitness freak"},
    ]
    await client.add(messages, user_id="client-alice")
    found = await client.search("What is Alice's favorite sport?", filters={"user_id": "client-alice"})
    print("search:", found["results"][0]["memory"])
    memories = await client.get_all(filters={"AND": [{"user_id": "client-alice"}]})
    print("get_all:", memories["count"], [m["memory"] for m in memories["results"]])
    memory_id = memories["results"][0]["id"]
    print("history:", [h["event"] for h in await client.history(memory_id=memory_id)])
    print(await client.delete(memory_id=memory_id))
    print(await client.delete_all(user_id="client-alice"))
    print("left:", (await client.get_all(filters={"AND": [{"user_id": "client-alice"}]}))["results"])


asyncio.run(main())
'''


def test_mem0s_platform_quickstart_and_async_client_run_with_only_their_imports_changed(served, tmp_path):
    out = run_program(served, tmp_path, PLATFORM_QUICKSTART)
    assert out.startswith("{'results': [{'id': ") and "'memory': \"I'm a vegetarian and allergic to nuts.\"" in out
    assert "'user_id': 'user123'" in out and "'score': " in out
    assert run_program(served, tmp_path, ASYNC_CLIENT).splitlines() == [
        "search: Alice loves playing badminton",
        "get_all: 2 ['Alice loves playing badminton', \"That's great! Alice is a fitness freak\"]",
        "history: ['ADD']", "{'message': 'Memory deleted successfully!'}",
        "{'message': 'Memories deleted successfully!'}", "left: []"]


# -- beyond the documents -------------------------------------------------------------------------
def test_results_carry_what_is_stored_and_scores_from_the_evidence(served):
    m, dana = Memory({"url": served.url, "api_key": served.keys["writer"]}), "passport-dana"
    [mine] = m.add("My passport expires in March.", user_id=dana, metadata={"topic": "documents", "n": 2})["results"]
    [theirs] = m.add([{"role": "assistant", "content": "Dana's passport renewal is booked.", "name": "Clerk"}],
                     user_id=dana, agent_id="clerk", run_id="r9")["results"]
    assert mine["actor_id"] is None and theirs["actor_id"] == "Clerk"
    got = m.get(mine["id"])
    assert got["metadata"] == {"topic": "documents", "n": 2} and got["user_id"] == dana
    assert "agent_id" not in got and "run_id" not in got and "actor_id" not in got  # nothing invented
    other = m.get(theirs["id"])
    assert (other["agent_id"], other["run_id"], other["actor_id"]) == ("clerk", "r9", "Clerk")
    assert other["role"] == "assistant"
    listed = {r["id"]: r for r in m.get_all(filters={"user_id": dana})["results"]}
    assert listed[mine["id"]]["metadata"] == got["metadata"] and "score" not in listed[mine["id"]]
    found = m.search("When does my passport expire?", filters={"user_id": dana}, explain=True)["results"]
    by_id = {r["id"]: r for r in found}
    assert by_id[mine["id"]]["metadata"] == {"topic": "documents", "n": 2} and "agent_id" not in by_id[mine["id"]]
    assert by_id[theirs["id"]]["agent_id"] == "clerk"
    with Client(served.url, served.keys["writer"]) as ms:  # the scores are the evidence's, in its order
        evidence = ms.search("When does my passport expire?", conversation_id=dana).evidence
    scores: dict[str, float] = {}
    for e in evidence:
        for t in e.turns:
            scores.setdefault(t.event_id, e.score)
    assert [r["score"] for r in found] == [scores[r["id"]] for r in found]
    assert found[0]["score_details"]["role"] == "primary"
    clerks = m.search("passport", filters={"user_id": dana, "agent_id": "clerk"})["results"]
    assert [r["id"] for r in clerks] == [theirs["id"]]
    for limit in ({"top_k": 1}, {"limit": 1}):  # limit: Mem0 1.x's name, onto max_turns as top_k
        first = m.search("passport", filters={"user_id": dana}, **limit)["results"]
        assert [r["id"] for r in first] == [found[0]["id"]]
    m.update(mine["id"], metadata={"n": 3})  # merged into the stored metadata, as Mem0 merges
    assert m.get(mine["id"])["metadata"] == {"topic": "documents", "n": 3}
    m.close()


def test_delete_all_forgets_exactly_the_memories_with_those_ids(served):
    m = Memory({"url": served.url, "api_key": served.keys["writer"]})
    keep_user = m.add("Erin keeps bees.", user_id="erin")["results"][0]["id"]
    keep_agent = m.add("Erin's hives need checking.", user_id="erin", agent_id="beekeeper")["results"][0]["id"]
    gone = m.add("The beekeeper orders frames.", agent_id="beekeeper")["results"][0]["id"]
    # an agent named as someone speaks: only what was added with that agent_id goes, not what Hana said
    said_by_hana = m.add([{"role": "user", "content": "Erin likes honey.", "name": "Hana"}],
                         user_id="erin-2")["results"][0]["id"]
    agent_hana = m.add("Hana the agent notes this.", user_id="erin-2", agent_id="Hana")["results"][0]["id"]
    m.delete_all(agent_id="Hana")
    assert m.get(said_by_hana) and m.get(agent_hana) is None
    m.delete_all(agent_id="beekeeper")
    assert m.get(gone) is None and m.get(keep_agent) is None and m.get(keep_user)
    m.delete_all(user_id="erin", run_id="default")  # a run named default is not "no run": each turn checked
    assert m.get(keep_user)
    m.delete_all(user_id="erin")
    assert m.get(keep_user) is None and m.get(said_by_hana)
    m.close()


def test_the_platform_clients_pages_options_and_refusals(served):
    client = MemoryClient(api_key=served.keys["writer"], host=served.url)
    added = [client.add(f"Frank's note number {i} about the garden.", user_id="frank", metadata={"i": i})["results"][0]
             for i in range(5)]
    first = client.get_all(filters={"AND": [{"user_id": "frank"}, {"metadata": {"i": {"gte": 1}}}]}, page_size=2)
    second = client.get_all({"filters": {"user_id": "frank"}, "page": 2, "page_size": 2})
    assert (first["count"], first["next"], first["previous"]) == (2, 2, None)
    assert [r["metadata"]["i"] for r in first["results"]] == [1, 2]
    assert [r["metadata"]["i"] for r in second["results"]] == [2, 3]
    found = client.search("garden note", filters={"user_id": "frank", "keywords": {"icontains": "NUMBER 4"}},
                          fields=["memory", "score"])
    [hit] = found["results"]
    assert hit == {"id": added[4]["id"], "memory": added[4]["memory"], "score": hit["score"]}
    updated = client.update(added[0]["id"], text="Frank's first note, corrected.", metadata={"fixed": True})
    assert updated["memory"] == "Frank's first note, corrected." and updated["metadata"] == {"i": 0, "fixed": True}
    with pytest.raises(NotFound):
        client.get("no-such-memory")
    with pytest.raises(ValidationError, match="Top-level entity parameters"):
        client.search("garden", user_id="frank")
    with pytest.raises(ValidationError, match=r"unknown option\(s\) \['tok_k'\]"):
        client.search("garden", filters={"user_id": "frank"}, tok_k=3)
    with pytest.raises(NotSupported, match="categories"):
        client.search("garden", filters={"user_id": "frank"}, categories=["hobby"])
    with pytest.raises(NotSupported, match="expiration_date"):
        client.add("temporary", user_id="frank", expiration_date="2030-01-01")
    deleted = client.batch_delete([{"memory_id": a["id"]} for a in added])
    assert deleted == {"message": "Successfully deleted 5 memories"}
    assert client.get_all(filters={"user_id": "frank"})["results"] == []
    client.close()

    async def run():
        async with AsyncMemoryClient(api_key=served.keys["writer"], host=served.url) as aclient:
            await aclient.add("Gus waters the ferns on Fridays.", user_id="gus", run_id="week-1")
            hits = await aclient.search("When are the ferns watered?", {"filters": {"AND": [{"user_id": "gus"},
                                                                                             {"run_id": "week-1"}]}})
            assert hits["results"][0]["run_id"] == "week-1"
            assert await aclient.delete_users(user_id="gus") == {"message": "Entity deleted successfully."}
            assert (await aclient.get_all(filters={"user_id": "gus"}))["results"] == []

    asyncio.run(run())
