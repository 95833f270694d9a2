"""The judge: raw records and a signed plan in, pass / marginal / fail / invalid verdicts out.

Pure (pandas, numpy; no ORM, no request). See docs/judge.md.
"""
from gates.judge.records import Inputs, RecordError, load_inputs
from gates.judge.verdicts import JUDGE_VERSION, VERDICT_SCHEMA, can_extend, canonical_json, evaluate, next_look

__all__ = ["JUDGE_VERSION", "VERDICT_SCHEMA", "Inputs", "RecordError", "can_extend", "canonical_json", "evaluate",
           "load_inputs", "next_look"]
