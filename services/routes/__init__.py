"""The HTTP API's routes, one module per area; services/api.py assembles them.

| module        | endpoints                                                              | who             |
|---------------|------------------------------------------------------------------------|-----------------|
| ingest.py     | POST /v1/events, POST /v1/wait                                         | writer / reader |
| query.py      | POST /v1/search, POST /v1/answer                                       | reader          |
| ops.py        | GET /v1/status, /metrics, /v1/ops/snapshot, /v1/dead-letters, pause/resume | reader / ops / admin |
| keys.py       | /v1/admin/keys…                                                        | admin           |
| dashboard.py  | /dashboard, its sign-in and assets                                     | ops session     |
"""
