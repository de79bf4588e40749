"""memstream_client: a light client for memstream (httpx and pydantic only).

    from memstream_client import Client
    with Client("http://127.0.0.1:8080", api_key="...") as ms:
        ms.wait(ms.add([{"conversation_id": "c1", "speaker": "Ada", "text": "I moved to Lisbon."}]).positions)
        print(ms.search("Where does Ada live?", conversation_id="c1").evidence[0].text)
"""

from memstream_client._http import RetryPolicy, merge_positions
from memstream_client._version import __version__
from memstream_client.batch import AsyncBatch, Batch
from memstream_client.client import AsyncClient, Client
from memstream_client.errors import (AuthenticationError, BadRequest, Conflict, InvalidRequest, MemstreamError,
                                     NotFound, PayloadTooLarge, PermissionDenied, RateLimited, TransportError,
                                     Unavailable, WaitTimeout)
from memstream_client.models import (AddResult, AnswerResult, Attachment, Evidence, ForgetResult, ItemResult,
                                     Positions, SearchResult, Status, StoredTurn, Turn, TurnHistory, TurnPage, TurnRef,
                                     ViewStatus)

__all__ = [
    "AddResult", "AnswerResult", "AsyncBatch", "AsyncClient", "Attachment", "AuthenticationError", "BadRequest",
    "Batch", "Client", "Conflict", "Evidence", "ForgetResult", "InvalidRequest", "ItemResult", "MemstreamError",
    "NotFound", "PayloadTooLarge", "PermissionDenied", "Positions", "RateLimited", "RetryPolicy", "SearchResult",
    "Status", "StoredTurn", "TransportError", "Turn", "TurnHistory", "TurnPage", "TurnRef", "Unavailable",
    "ViewStatus", "WaitTimeout", "__version__", "merge_positions",
]
