"""A Mem0-compatible surface: `Memory` and `AsyncMemory` (Mem0's open-source classes) and
`MemoryClient` and `AsyncMemoryClient` (its hosted platform's clients) with the method names,
parameters and result shapes of the `mem0ai` 2.2.1 release (a test compares the signatures with
its source), on memstream's model. Switching an agent over is changing its import:

    from memstream_client.compat.mem0 import Memory      # was: from mem0 import Memory

What maps to what (memstream keeps the raw turns and calls no LLM to extract "memories"):

- a memory is a turn; its `id` is the turn's event id; `memory` is the turn's text;
- `user_id` is the conversation, `run_id` the session, `agent_id` the agent; the ids a memory was
  added with are stored with it and returned as given, nothing invented (plans.py);
- `add(messages, …)` stores each non-system message as a turn (`infer`, `prompt` and the
  platform's extraction options change nothing) and returns once it is searchable;
- `search` is memstream's retrieval over the boundary the filters' ids name; `top_k` (`limit`) is
  its `max_turns`; each result's `score` is the score its evidence unit was ranked by — higher
  first, comparable within one response only, not a similarity on a fixed scale, so `threshold`
  is not applied;
- `filters` follow mem0ai 2.2.1's grammar (filters.py): the ids bound the server's search, the
  rest (metadata, operators, AND/OR/NOT) is applied by the client to what is stored, over more
  candidates than `top_k` so that a filter still fills it where it can;
- `update(id, text)` stores a correcting turn that supersedes the latest version (searches return
  the correction under the original id; `history` keeps every version);
- `delete` and `delete_all` forget (the turns are erased from the log and every view — their
  history with them); `reset` forgets the whole tenant (an admin key naming the tenant).

`Memory` takes `config={"url", "api_key", "tenant_id", "wait_seconds", "strategy"}` or, as
`Memory()`, reads MEMSTREAM_URL and MEMSTREAM_API_KEY; `MemoryClient(api_key=…, host=…)` the same.
"""

from memstream_client.compat.mem0.errors import NotSupported, ValidationError
from memstream_client.compat.mem0.memory import AsyncMemory, Memory
from memstream_client.compat.mem0.platform import AsyncMemoryClient, MemoryClient

__all__ = ["AsyncMemory", "AsyncMemoryClient", "Memory", "MemoryClient", "NotSupported", "ValidationError"]
