#!/usr/bin/env python3
"""Generate schemas/openapi.json from the JSON Schema files in schemas/json.

Deterministic: run `python3 schemas/gen_openapi.py` from anywhere; it rewrites
schemas/openapi.json next to this script. The test
`schemas/tests/json_schemas.rs` checks that every component generated from a
schema file equals that file with its `$id`/`$schema` removed and its `$ref`s
rewritten by `rewrite_ref` below, so keep the two in sync.

Rules:
- every `schemas/json/**/<Name>.schema.json` becomes `components/schemas/<Name>`
  (e.g. `DeliveryStatus`, `message.send.params`), except `defs.schema.json`,
  whose `$defs` each become a component of their own (`account_id`, ...);
- `$ref`s are rewritten to `#/components/schemas/...`;
- one `POST /v1/rpc/{method}` path per client method that is callable over
  HTTP (PROTOCOL §4; `session.attach` is WebSocket only and so has schemas but
  no path), plus `GET /healthz`; the Web Push methods of §9 count as client methods.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
JSON_DIR = os.path.join(HERE, "json")
OUT = os.path.join(HERE, "openapi.json")

# PROTOCOL §4: (method, needs a session)
CLIENT_METHODS = [
    ("account.register", False),
    ("session.challenge", False),
    ("session.open", False),
    ("session.attach", None),  # WebSocket only
    ("device.add", True),
    ("device.revoke", True),
    ("account.devices.get", True),
    ("account.settings.update", True),
    ("route.get", False),
    ("route.update", True),
    ("contact.revoke", True),
    ("message.send", True),
    ("message.delivery.status", True),
    ("message.timeline.sync", True),
    ("message.timeline.ack", True),
    # PROTOCOL §9 (Web Push)
    ("push.vapid_key", False),
    ("push.subscribe", True),
    ("push.unsubscribe", True),
]

# PROTOCOL §2 RelayError table: HTTP status -> codes
ERROR_STATUSES = [
    ("400", ["invalid_params", "invalid_signature"]),
    ("401", ["unauthorized"]),
    ("403", ["forbidden"]),
    ("404", ["not_found", "route_not_found"]),
    ("409", ["state_conflict", "invalid_state"]),
    ("413", ["payload_too_large"]),
    ("421", ["route_stale", "target_not_local"]),
    ("422", ["device_unknown", "clock_skew", "message_expired"]),
    ("429", ["rate_limited"]),
    ("500", ["internal_error"]),
    ("502", ["bad_gateway"]),
    ("503", ["temporarily_unavailable"]),
]

SCHEMA_SUFFIX = ".schema.json"


def component_name(file_part):
    base = file_part.rsplit("/", 1)[-1]
    assert base.endswith(SCHEMA_SUFFIX), file_part
    return base[: -len(SCHEMA_SUFFIX)]


def rewrite_ref(ref, current_file):
    """Map a relative `$ref` of a schema file to a ref inside the OpenAPI document."""
    file_part, _, fragment = ref.partition("#")
    name = component_name(file_part or current_file)
    if name == "defs":
        prefix = "/$defs/"
        assert fragment.startswith(prefix) and "/" not in fragment[len(prefix):], ref
        return "#/components/schemas/" + fragment[len(prefix):]
    assert fragment == "", "refs into non-defs files must target the whole file: " + ref
    return "#/components/schemas/" + name


def rewrite(value, current_file):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                out[key] = rewrite_ref(item, current_file)
            else:
                out[key] = rewrite(item, current_file)
        return out
    if isinstance(value, list):
        return [rewrite(item, current_file) for item in value]
    return value


def load_files():
    files = []
    for root, dirs, names in os.walk(JSON_DIR):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(SCHEMA_SUFFIX):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, JSON_DIR).replace(os.sep, "/")
                if rel.startswith("audit/"):
                    continue  # `relay audit` output formats, not part of the HTTP API
                with open(path, encoding="utf-8") as f:
                    files.append((rel, json.load(f)))
    files.sort(key=lambda item: item[0])
    return files


def components_from_files():
    schemas = {}

    def add(name, schema):
        assert name not in schemas, "duplicate component " + name
        schemas[name] = schema

    for rel, doc in load_files():
        name = component_name(rel)
        if name == "defs":
            for def_name, definition in doc["$defs"].items():
                add(def_name, rewrite(definition, rel))
            continue
        body = {k: v for k, v in doc.items() if k not in ("$id", "$schema")}
        add(name, rewrite(body, rel))
    return schemas


def json_content(ref):
    return {"application/json": {"schema": {"$ref": ref}}}


def build():
    schemas = components_from_files()
    responses = {}
    for status, codes in ERROR_STATUSES:
        schema_name = "ErrorResponse" + status
        schemas[schema_name] = {
            "description": "ErrorResponse whose code maps to HTTP " + status + ".",
            "allOf": [
                {"$ref": "#/components/schemas/ErrorResponse"},
                {"properties": {"error": {"properties": {"code": {"enum": codes}}}}},
            ],
        }
        responses["Error" + status] = {
            "description": "Failure: " + ", ".join(codes),
            "content": json_content("#/components/schemas/" + schema_name),
        }
    error_refs = {status: {"$ref": "#/components/responses/Error" + status} for status, _ in ERROR_STATUSES}

    paths = {}
    for method, session in CLIENT_METHODS:
        assert method + ".params" in schemas and method + ".result" in schemas, method
        if session is None:
            continue
        operation = {
            "operationId": method,
            "summary": method,
            "tags": ["client"],
            "security": [{"bearerAuth": []}] if session else [],
            "requestBody": {
                "required": True,
                "content": json_content("#/components/schemas/" + method + ".params"),
            },
            "responses": {
                "200": {
                    "description": "Success",
                    "content": json_content("#/components/schemas/" + method + ".result"),
                },
                **error_refs,
            },
        }
        paths["/v1/rpc/" + method] = {"post": operation}
    paths["/healthz"] = {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness check",
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": {"description": "Healthy", "content": json_content("#/components/schemas/healthz.result")}
            },
        }
    }

    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "Relay client API",
            "version": "1",
            "description": (
                "Client HTTP transport of relay protocol version 1: POST /v1/rpc/{method} with the params "
                "object as body; HTTP 200 with the result object, or the RelayError's HTTP status with "
                "{\"error\": RelayError}. session.attach is WebSocket only (GET /v1/ws) and has schemas but "
                "no path. Relay-to-relay methods (POST /v1/relay/{method}, authenticated with the Relay-Id, "
                "Relay-Timestamp and Relay-Signature headers) and WebSocket notifications are described by "
                "their components only. Generated by schemas/gen_openapi.py from schemas/json."
            ),
        },
        "tags": [
            {"name": "client", "description": "Client methods (PROTOCOL §4)"},
            {"name": "operations", "description": "Health"},
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": responses,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "Session token from session.open"}
            },
        },
    }


def main():
    text = json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit("schemas/openapi.json is out of date; run python3 schemas/gen_openapi.py")
        return
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
