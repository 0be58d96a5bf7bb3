"""``text.search``: read-only keyword search over a small in-memory corpus."""

from __future__ import annotations

from pydantic import Field

from capabilities.context import CallContext
from capabilities.contract import ContractModel, Example
from capabilities.registry import capability

CORPUS: dict[str, tuple[str, str]] = {
    "doc-1": ("mTLS basics", "mutual tls authenticates both client and server with certificates"),
    "doc-2": ("SPIFFE IDs", "a spiffe id names a workload inside a trust domain"),
    "doc-3": ("Audit logs", "a hash chain makes an append only audit log tamper evident"),
    "doc-4": ("Least privilege", "grant each peer only the capabilities it needs"),
    "doc-5": ("Idempotency", "an idempotency key makes a retried write happen exactly once"),
}


class SearchInput(ContractModel):
    """Words to look for."""

    query: str = Field(min_length=1, max_length=200)
    limit: int = Field(default=3, ge=1, le=20)


class SearchHit(ContractModel):
    """One matching document."""

    id: str
    title: str
    score: int = Field(ge=1)


class SearchOutput(ContractModel):
    """Hits, best first."""

    items: list[SearchHit]


@capability(
    "text.search",
    "1.0.0",
    risk="read",
    timeout=2.0,
    idempotent=True,
    preconditions=["query holds at least one word"],
    examples=[
        Example(
            input={"query": "audit", "limit": 1},
            output={"items": [{"id": "doc-3", "title": "Audit logs", "score": 1}]},
        )
    ],
)
async def search(inp: SearchInput, ctx: CallContext) -> SearchOutput:
    """Rank corpus documents by how many query words they contain."""
    words = {word for word in inp.query.lower().split() if word}
    hits = []
    for doc_id, (title, body) in CORPUS.items():
        text = f"{title} {body}".lower().split()
        score = sum(1 for word in words if word in text)
        if score:
            hits.append(SearchHit(id=doc_id, title=title, score=score))
    hits.sort(key=lambda hit: (-hit.score, hit.id))
    return SearchOutput(items=hits[: inp.limit])
