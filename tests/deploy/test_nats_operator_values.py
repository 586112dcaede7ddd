"""The chart's side of the bundled NATS in operator mode: the account the service signs agents for reaches
it as ``REMEDIATOR_NATS_ACCOUNT``, and the values schema takes only an account public key there. The
server side (the include of ``bus operator``'s auth.conf) runs against a real nats-server in
``tests/integration/test_nats_operator.py``.
"""

from __future__ import annotations

import helm_python
import pytest

from remediator.identity import keys
from tests.deploy.chart import container, env, only, render


def test_the_account_reaches_the_service_when_set() -> None:
    account = keys.create("account").public_key
    service = container(only(render({"nats": {"account": account}}), "Deployment"))
    assert env(service)["REMEDIATOR_NATS_ACCOUNT"] == account
    assert "REMEDIATOR_NATS_ACCOUNT" not in env(container(only(render(), "Deployment")))


@pytest.mark.parametrize("bad", [keys.create("user").public_key, "not-a-key", "A" * 55])
def test_the_schema_takes_only_an_account_public_key(bad: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render({"nats": {"account": bad}})
