"""Real client packages pointed at clef-bridge (issue 54), over a real socket on the tiny model, each calling the path
its own source builds from the server root: OpenRouter's alpha decisions (pydecide's openrouter backend, fuzzy-jev,
litellm's openrouter provider), Workers AI's run route without an account (trustcall-system-one, litellm's
cloudflare provider), a System One body on /v1/decisions (litellm's perplexity and empiriolabs providers), Azure AI
Foundry's and Azure OpenAI's paths (litellm's azure_ai and azure providers, the latter's key in `api-key`), and
OpenAI's Decisions at /decisions (pydecide's openai_decisions backend given the root). Every answer is checked
against the server's own /v1/systemone answer to the same question."""

from __future__ import annotations

import asyncio
import os
import warnings

import pytest

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration

KEY = "client-key"
STATE = "Customer: my March invoice was charged twice, please refund one."
QUESTIONS = {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
             "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "invoices",
                                                                                      "tech": None}},
             "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]}}


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clients")
    (folder / "keys.txt").write_text(f"{KEY}\n")
    registry = registry_for(tiny_spec(fx, aliases=["clef", "~typesafe/jev-latest"]), folder / "models.toml",
                            api_keys_file=folder / "keys.txt")
    with RunningServer(registry) as srv:
        yield srv


def answered(server, questions: dict) -> dict:
    """The server's own System One answers: a client's numbers for the same questions must be these."""
    reply = server.post({"model": "tiny", "state": STATE, "questions": questions},
                        headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status == 200
    return reply.json()["answers"]


@pytest.fixture(scope="module")
def truth(server):
    return answered(server, QUESTIONS)


def close(got: float, want: float) -> bool:
    return abs(got - want) < 1e-4


def test_pydecides_openrouter_backend_on_both_bases(server, truth):
    from decide import Choice, Client, Noul, Score
    from decide.backends.openrouter import OpenRouterBackend

    questions = {"refund": Noul(instructions=QUESTIONS["refund"]["instructions"]),
                 "team": Choice(instructions="Which team?", criteria={"billing": "invoices", "tech": None}),
                 "anger": Score(instructions="How angry?", criteria=["calm", "annoyed", "furious"])}
    for base in (server.url, server.url + "/api"):  # /alpha/decisions and /api/alpha/decisions
        client = Client(backends=[OpenRouterBackend(KEY, base_url=base)], on_low_confidence="accept")
        response = client.decide(STATE, questions, model="tiny")
        assert close(response.answers["refund"].noul, truth["refund"]["noul"])
        assert response.answers["team"].choice == truth["team"]["choice"]


def test_pydecides_openai_decisions_backend_given_the_root(server):
    from decide import Client, Noul
    from decide.backends.openai_decisions import OpenAIDecisionsBackend

    client = Client(backends=[OpenAIDecisionsBackend(KEY, base_url=server.url)], on_low_confidence="accept")
    response = client.decide(STATE, {"refund": Noul(instructions=QUESTIONS["refund"]["instructions"])},
                             model="tiny")  # POST /decisions, OpenAI's shape
    alone = answered(server, {"refund": QUESTIONS["refund"]})  # one question, asked alone
    assert close(response.answers["refund"].noul, alone["refund"]["noul"])


def test_fuzzy_jev_reads_every_field_it_requires(server):
    import jev

    client = jev.Client(KEY, model="~typesafe/jev-latest", url=server.url + "/api/alpha/decisions")
    response = client.decide(STATE, {qid: jev.Question.from_dict(q) for qid, q in QUESTIONS.items()})
    truth = answered(server, dict(sorted(QUESTIONS.items())))  # it sends the questions sorted by id
    assert response.model == "~typesafe/jev-latest" and response.usage.input_tokens > 0
    assert close(float(response.answers["refund"]), truth["refund"]["noul"])
    assert response.answers["anger"].confidence == pytest.approx(truth["anger"]["confidence"], abs=1e-4)


def test_trustcalls_cloudflare_transport_given_the_root(server, truth):
    from trustcall_system_one.transport import CallMeta, CloudflareTransport

    async def call() -> dict:
        async with CloudflareTransport(api_token=KEY, base_url=server.url, max_retries=0) as transport:
            body = {"model": "clef", "state": STATE, "questions": QUESTIONS}
            return (await transport.run("@cf/cloudflare/clef", body, meta=CallMeta(kind="raw"), timeout=60)).body

    body = asyncio.run(call())
    answers = body.get("result", body)["answers"]
    assert close(answers["refund"]["noul"], truth["refund"]["noul"])


@pytest.fixture(scope="module")
def litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map fetched at import
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import litellm as module
    module.suppress_debug_info = True
    return module


@pytest.mark.parametrize("provider, model, base", [
    ("openrouter", "openrouter/tiny", ""), ("cloudflare", "cloudflare/tiny", ""),
    ("perplexity", "perplexity/tiny", ""), ("empiriolabs", "empiriolabs/tiny", ""),
    ("azure_ai", "azure_ai/tiny", ""), ("perplexity with /v1", "perplexity/tiny", "/v1")])
def test_litellms_system_one_providers(server, truth, litellm, provider, model, base):
    response = litellm.systemone(model=model, state=STATE, questions=QUESTIONS, api_base=server.url + base,
                                 api_key=KEY)
    answers = response.answers
    assert close(answers["refund"].noul, truth["refund"]["noul"]), provider
    assert answers["team"].choice == truth["team"]["choice"] and answers["anger"].legend


def test_litellms_azure_provider_with_its_api_key_header(server, litellm):
    questions = [{"type": "predicate", "name": "refund", "instructions": QUESTIONS["refund"]["instructions"]}]
    response = litellm.decisions(model="azure/tiny", input=STATE, questions=questions, api_base=server.url,
                                 api_key=KEY)  # POST /openai/v1/decisions, the key in api-key
    alone = answered(server, {"refund": QUESTIONS["refund"]})
    assert close(response.answers[0].probability, alone["refund"]["noul"])
