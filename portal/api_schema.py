"""The OpenAPI 3.1 description of portal.api, built from small helpers so each path is one line."""
from __future__ import annotations

API_VERSION = "1"

UUID_PARAM = {"type": "string", "format": "uuid"}
TEXT = {"type": "string"}
MAYBE_TEXT = {"type": ["string", "null"]}
TIME = {"type": ["string", "null"], "format": "date-time"}


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": required or list(properties)}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _list_of(key: str, name: str) -> dict:
    return _obj({key: {"type": "array", "items": _ref(name)}})


COMPONENTS = {
    "Error": _obj({"error": TEXT}),
    "Pilot": _obj({
        "id": UUID_PARAM, "name": TEXT, "customer": TEXT, "vendor": TEXT, "model_under_test": TEXT, "llm_model": TEXT,
        "state": {"enum": ["draft", "active", "completed", "halted"]},
        "current_gate": {"type": ["integer", "null"]}, "halted_reason": MAYBE_TEXT, "start_date": {"type": "string", "format": "date"},
        "outcome": _ref("Outcome"),
    }),
    "Outcome": _obj({
        "code": {"enum": ["proven", "accepted", "not-proven", "halted", "error", "in-progress"],
                 "description": "what the pilot proved (gates/outcome.py): the overview, the procurement report and "
                                "the demo say the same"},
        "gate": {"type": ["integer", "null"]}, "review_gates": {"type": "array", "items": {"type": "integer"}},
        "criteria": {"type": "array", "items": TEXT}, "reason": TEXT, "final": {"type": "boolean"},
        "word": {"type": "object", "properties": {"en": TEXT, "zh-hans": TEXT}},
        "sentence": {"type": "object", "properties": {"en": TEXT, "zh-hans": TEXT}},
    }),
    "Gate": _obj({
        "gate": TEXT, "number": {"type": "integer", "minimum": 1, "maximum": 4}, "name": TEXT,
        "state": {"enum": ["pending", "open", "review", "awaiting_signoff", "signed_off", "failed"]},
        "verdict": {"enum": ["pass", "marginal", "fail", "invalid", None]},
        "planned_start": {"type": "string", "format": "date"}, "planned_end": {"type": "string", "format": "date"},
        "opened_at": TIME, "closed_at": TIME, "overdue": {"type": "boolean"},
    }),
    "Verdict": _obj({
        "id": {"type": "integer"}, "gate": TEXT, "verdict": {"enum": ["pass", "marginal", "fail", "invalid"]},
        "simulated": {"type": "boolean"}, "created": TIME, "plan_version": {"type": "integer"},
        "inputs": {"type": "object", "additionalProperties": TEXT},
        "result": {"type": "object", "description": "fxpilot.verdict/1 (docs/contracts.md §4)"},
    }),
    "Run": _obj({
        "id": UUID_PARAM, "kind": {"enum": ["gate_run", "probe"]}, "gate": MAYBE_TEXT,
        "status": {"enum": ["pending", "running", "successful", "failed", "error", "canceled"]},
        "error": MAYBE_TEXT, "created": TIME, "started": TIME, "finished": TIME, "cancel_requested": {"type": "boolean"},
    }),
    "Artifact": _obj({
        "id": UUID_PARAM, "name": TEXT, "kind": TEXT, "sha256": TEXT, "size": {"type": "integer"},
        "simulated": {"type": "boolean"}, "created": TIME, "download": TEXT,
    }),
    "Report": _obj({
        "id": UUID_PARAM, "kind": {"enum": ["gate", "procurement"]}, "gate": MAYBE_TEXT, "language": TEXT, "sha256": TEXT,
        "size": {"type": "integer"}, "simulated": {"type": "boolean"}, "signatures": {"type": "integer"},
        "created": TIME, "download": TEXT,
    }),
    "LogChunk": _obj({"seq": {"type": "integer"}, "stream": {"enum": ["stdout", "stderr", "system"]}, "text": TEXT,
                      "label": TEXT, "continues": {"type": "boolean"}}),
}


def _param(name: str, schema: dict, where: str = "path", description: str = "") -> dict:
    return {"name": name, "in": where, "required": where == "path", "schema": schema, "description": description}


PILOT = _param("pilot", UUID_PARAM, description="the pilot's id")
GATE = _param("number", {"type": "integer", "minimum": 1, "maximum": 4}, description="gate number 1–4")
RUN = _param("run", UUID_PARAM, description="the run's id")


def _get(summary: str, params: list[dict], ok: dict, *, binary: str | None = None) -> dict:
    content = {binary: {"schema": {"type": "string", "format": "binary"}}} if binary else {"application/json": {"schema": ok}}
    error = {"application/json": {"schema": _ref("Error")}}
    return {"get": {
        "summary": summary, "parameters": params,
        "responses": {
            "200": {"description": "OK", "content": content},
            "400": {"description": "Bad parameter", "content": error},
            "401": {"description": "Not authenticated: no token, or one unknown, revoked or expired", "content": error},
            "404": {"description": "Not found, or not yours to see", "content": error},
        },
    }}


def schema() -> dict:
    paths = {
        "/api/v1/pilots": _get("Pilots you can see", [], _list_of("pilots", "Pilot")),
        "/api/v1/pilots/{pilot}": _get("One pilot, its gates and signed plan", [PILOT], _ref("Pilot")),
        "/api/v1/pilots/{pilot}/gates": _get("The four gates of a pilot", [PILOT], _list_of("gates", "Gate")),
        "/api/v1/pilots/{pilot}/gates/{number}": _get("One gate, its latest verdict and sign-offs", [PILOT, GATE], _ref("Gate")),
        "/api/v1/pilots/{pilot}/gates/{number}/verdicts": _get(
            "Every evaluation of a gate", [PILOT, GATE], _list_of("verdicts", "Verdict")),
        "/api/v1/pilots/{pilot}/runs": _get("Runs of a pilot", [PILOT], _list_of("runs", "Run")),
        "/api/v1/pilots/{pilot}/reports": _get("Signed reports of a pilot", [PILOT], _list_of("reports", "Report")),
        "/api/v1/runs/{run}": _get("One run with its steps and progress", [RUN], _ref("Run")),
        "/api/v1/runs/{run}/log": _get(
            "The run's output after a chunk number", [RUN, _param("after", {"type": "integer", "minimum": 0}, "query")],
            _obj({"chunks": {"type": "array", "items": _ref("LogChunk")}, "finished": {"type": "boolean"}})),
        "/api/v1/runs/{run}/artifacts": _get("The run's artifacts with SHA-256", [RUN], _list_of("artifacts", "Artifact")),
        "/api/v1/runs/{run}/results": _get(
            "The run's results per arm, concurrency and phase: AIPerf 0.13 and llm-d report v0.2 forms, CSV rows, and "
            "the customer's own measurements (labelled as his)", [RUN],
            _obj({"fxpilot": {"type": "object"}, "cells": {"type": "array", "items": {"type": "object"}},
                  "csv": {"type": "array", "items": {"type": "object"}},
                  "customer_measurements": {"type": "array", "items": {"type": "object"}}})),
        "/api/v1/artifacts/{artifact}/download": _get(
            "An artifact's bytes", [_param("artifact", UUID_PARAM)], {}, binary="application/octet-stream"),
        "/api/v1/reports/{report}/download": _get(
            "A signed PDF report", [_param("report", UUID_PARAM)], {}, binary="application/pdf"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fxpilot API", "version": API_VERSION,
                 "description": "Read-only access to pilots, gates, runs, verdicts, artifacts and reports, scoped like the portal."},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": COMPONENTS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": (
                "A personal token from the account page (/accounts/) or manage.py api_token. Every token expires "
                "(90 days by default); an expired, revoked or unknown token answers 401 saying which.")}},
        },
        "security": [{"bearer": []}],
    }
