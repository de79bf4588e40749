"""Store errors on the query path (services/query/context.py `unavailable_as`): an outage becomes
ViewUnavailable naming the view (fallback or 503), refused credentials are never hidden behind one."""

import pytest

from schemas.errors import CredentialsRefused, StoreError, TransientError, ViewUnavailable
from services.query.context import unavailable_as

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("error", [TransientError("connection refused\ntraceback…"), StoreError("index missing")])
def test_an_outage_names_the_view(error):
    with pytest.raises(ViewUnavailable) as caught:
        with unavailable_as("graph"):
            raise error
    assert caught.value.view == "graph" and "\n" not in caught.value.reason and caught.value.__cause__ is error


def test_refused_credentials_are_not_an_outage():
    with pytest.raises(CredentialsRefused):
        with unavailable_as("dense"):
            raise CredentialsRefused("the Qdrant server refused the API key (MEMSTREAM_VIEWS_QDRANT_API_KEY)")
