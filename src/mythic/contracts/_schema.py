"""JSON Schema of the v1 protocol, for game clients written in other languages."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from mythic.contracts._messages import MESSAGE_TYPES, ClientMessage, Message, ServerMessage

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _document(schema: dict[str, Any], title: str, description: str) -> dict[str, Any]:
    return {"$schema": _DIALECT, "title": title, "description": description, **schema}


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema documents (draft 2020-12) of the v1 protocol, by relative file name.

    `mythic-v1.schema.json` is the whole protocol: a `oneOf` over every message with the
    discriminator on `type`; `mythic-v1-client.schema.json` and `mythic-v1-server.schema.json`
    are what each side sends; `messages/<Type>.schema.json` is one message.
    """
    unions: dict[str, tuple[Any, str, str]] = {
        "mythic-v1.schema.json": (Message, "MythicMessage", "Any Mythic v1 message."),
        "mythic-v1-client.schema.json": (
            ClientMessage,
            "MythicClientMessage",
            "A Mythic v1 message a game client sends to the server.",
        ),
        "mythic-v1-server.schema.json": (
            ServerMessage,
            "MythicServerMessage",
            "A Mythic v1 message the server sends to a game client.",
        ),
    }
    documents = {
        name: _document(TypeAdapter(union).json_schema(), title, description)
        for name, (union, title, description) in unions.items()
    }
    for type_name, model in MESSAGE_TYPES.items():
        schema = model.model_json_schema()
        documents[f"messages/{type_name}.schema.json"] = {"$schema": _DIALECT, **schema}
    return documents
